"""YOLO11-cls: the backbone-only network and the Classify head against the reference (sizes, outputs on the same
weights), its files read by the guarded reader, fine-tuning from a detection file, runs refused for now."""

from __future__ import annotations

import copy
import os
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")  # before any import of the reference package

import pytest
import torch
from model_oracle import reference_task_model, save_like_release

from yolo11_lightning import YOLO11
from yolo11_lightning.model_files.weights import load_model, load_pretrained, save_weights
from yolo11_lightning.nn.attention import C2PSA
from yolo11_lightning.tasks import create_model
from yolo11_lightning.tasks.classify.head import Classify

# Exact parameter counts of the reference YOLO11-cls at nc=1000 (ImageNet; docs/reference.md).
CLS_PARAMS = {"n": 2_812_104, "s": 6_724_008, "m": 11_634_216, "l": 14_115_624, "x": 29_637_064}


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("scale", list(CLS_PARAMS))
def test_parameter_counts_match_reference(scale: str) -> None:
    with torch.device("meta"):
        ours = create_model(scale, 1000, task="classify")
    assert n_params(ours) == CLS_PARAMS[scale]
    assert len(ours.layers) == 10 and isinstance(ours.layers[9], C2PSA) and isinstance(ours.head, Classify)
    ref = reference_task_model("classify", scale, 1000, device="meta")
    assert [tuple(v.shape) for v in ours.state_dict().values()] == [
        tuple(v.shape) for v in ref.state_dict().values()
    ]


def test_eval_outputs_equal_the_reference_on_its_weights() -> None:
    ref = reference_task_model("classify", "n", 10, seed=4).eval()
    with torch.no_grad():
        ref.model[-1].linear.weight.mul_(30)  # spread the logits: a non-trivial comparison
    ours = load_model(ref.state_dict()).eval()
    assert (ours.task, ours.num_classes, ours.strides) == ("classify", 10, (32,))
    # The reference's classifier keeps PyTorch's BatchNorm settings (its detectors set eps 1e-3, momentum 0.03).
    assert {(m.eps, m.momentum) for m in ours.modules() if isinstance(m, torch.nn.BatchNorm2d)} == {
        (1e-5, 0.1)
    }
    x = torch.rand(3, 3, 64, 96, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected, logits = ref(x)
        got = ours(x)
        train_logits = ours.train_outputs(x)
    assert got.shape == expected.shape == (3, 10)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)  # probabilities
    torch.testing.assert_close(train_logits, logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.sum(1), torch.ones(3))
    assert (
        expected.std() > 0.05
    )  # spread over the classes (a random network gives every image about the same)


def test_detection_tasks_keep_their_network() -> None:
    with torch.device("meta"):
        assert len(YOLO11("n", 80).layers) == 23 and YOLO11("n", 80).strides == (8, 16, 32)


def test_reference_files_and_our_files(tmp_path: Path) -> None:
    ref = reference_task_model("classify", "n", 5, seed=1)
    path = save_like_release(ref, tmp_path / "yolo11n-cls.pt", {i: f"k{i}" for i in range(5)})
    ours = load_model(path, task=None)
    assert (ours.task, ours.num_classes, ours.names) == ("classify", 5, [f"k{i}" for i in range(5)])
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = copy.deepcopy(ref).half().float().eval()(x)[0]
        got = ours(x)
    assert (got - expected).abs().max() <= 1e-3
    save_weights(ours, tmp_path / "cls.pth")
    with torch.no_grad():
        torch.testing.assert_close(load_model(tmp_path / "cls.pth")(x), got)
    fused = copy.deepcopy(ours).fuse()
    with torch.no_grad():
        torch.testing.assert_close(fused(x), got, atol=1e-5, rtol=1e-4)
    ours.reset_head(3)
    with torch.no_grad():
        assert ours(x).shape == (2, 3)
    with pytest.raises(
        ValueError, match=r"holds a classification model .*ClassificationModel.*not a detection model"
    ):
        load_model(path, task="detect")


def test_fine_tuning_from_a_detection_file(tmp_path: Path) -> None:
    """The backbone layers 0-8 come from a detection file (name and shape, as the reference's intersect)."""
    det = reference_task_model("detect", "n", 80)
    det_file = save_like_release(det, tmp_path / "det.pt")
    model = create_model("n", 1000, task="classify")
    load_pretrained(model, det_file, strict=False, warn=lambda m: None)
    reference = load_model(det_file).state_dict()
    for key in ("layers.0.conv.weight", "layers.8.m.0.m.0.cv1.conv.weight"):
        torch.testing.assert_close(model.state_dict()[key], reference[key])
    cls_file = save_like_release(reference_task_model("classify", "n", 1000), tmp_path / "cls.pt")
    model = create_model("n", 10, task="classify")
    _loaded, skipped = load_pretrained(model, cls_file, info=lambda m: None)  # another class count: fine
    assert skipped == ["head.linear.weight", "head.linear.bias"]


def test_runs_are_accepted() -> None:
    """Data, metrics, prediction and export are in place: a module of the task is built."""
    from yolo11_lightning import YOLO11Module

    module = YOLO11Module(task="classify", num_classes=10)
    assert module.task.name == "classify" and module.hparams.task == "classify"
