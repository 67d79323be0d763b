"""YOLO11-obb: sizes against the reference, eval outputs equal to the reference's on the same weights, the
reference's files read by the guarded reader, fine-tuning from another task's file, runs refused for now."""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")  # before any import of the reference package

import pytest
import torch
from model_oracle import reference_task_model, save_like_release

from yolo11_lightning.model_files.weights import load_model, load_pretrained, save_weights
from yolo11_lightning.tasks import create_model
from yolo11_lightning.tasks.obb.head import OBB, ObbOutput

# Exact parameter counts of the reference YOLO11-obb at nc=15 (DOTA; docs/reference.md).
OBB_PARAMS = {"n": 2_664_432, "s": 9_719_776, "m": 20_913_408, "l": 26_170_880, "x": 58_800_256}
INPUT_SHAPE = (2, 3, 64, 96)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def num_anchors(h: int, w: int) -> int:
    return sum((h // s) * (w // s) for s in (8, 16, 32))


@pytest.mark.parametrize("scale", list(OBB_PARAMS))
def test_parameter_counts_match_reference(scale: str) -> None:
    with torch.device("meta"):
        ours = create_model(scale, 15, task="obb")
    assert n_params(ours) == OBB_PARAMS[scale]
    ref = reference_task_model("obb", scale, 15, device="meta")
    assert [tuple(v.shape) for v in ours.state_dict().values()] == [
        tuple(v.shape) for v in ref.state_dict().values()
    ]


def test_eval_outputs_equal_the_reference_on_its_weights() -> None:
    h, w = INPUT_SHAPE[2:]
    ref = reference_task_model("obb", "n", 15, seed=2).eval()
    ours = load_model(ref.state_dict()).eval()
    assert (ours.task, ours.num_classes, ours.kpt_shape) == ("obb", 15, None)
    x = torch.rand(INPUT_SHAPE, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected, (_, angle) = ref(x)
        got = ours(x)
        train_out = ours.train_outputs(x)
    assert got.shape == expected.shape == (2, 4 + 15 + 1, num_anchors(h, w))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(train_out.angles, angle, rtol=1e-6, atol=1e-6)  # radians, as the reference's
    assert expected[:, -1].std() > 0.05  # the angles vary: a non-trivial check


def test_output_contract() -> None:
    torch.manual_seed(0)
    model = create_model("n", 3, task="obb")
    x = torch.rand(INPUT_SHAPE)
    h, w = INPUT_SHAPE[2:]
    with torch.no_grad():
        out = model.train()(x)
        assert isinstance(out, ObbOutput) and isinstance(model.head, OBB)
        assert [tuple(m.shape) for m in out.maps] == [(2, 64 + 3, h // s, w // s) for s in (8, 16, 32)]
        assert out.angles.shape == (2, 1, num_anchors(h, w))
        assert (out.angles >= -math.pi / 4).all() and (out.angles < 3 * math.pi / 4).all()
        preds = model.eval()(x)
        raw = model.train_outputs(x)  # the raw outputs in eval mode (BN on running statistics)
    assert preds.shape == (2, 4 + 3 + 1, num_anchors(h, w))
    torch.testing.assert_close(preds[:, 4:7], model.head.decode(raw.maps)[:, 4:])  # the scores are Detect's
    torch.testing.assert_close(preds[:, 7:], raw.angles)


def test_reference_files_and_our_files(tmp_path: Path) -> None:
    ref = reference_task_model("obb", "s", 4, seed=7)
    path = save_like_release(ref, tmp_path / "yolo11s-obb.pt", {i: f"c{i}" for i in range(4)})
    ours = load_model(path, task="obb")
    assert (ours.task, ours.scale, ours.num_classes, ours.names) == ("obb", "s", 4, ["c0", "c1", "c2", "c3"])
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = copy.deepcopy(ref).half().float().eval()(x)[0]
        got = ours(x)
    assert (got - expected).abs().max() <= 1e-3
    save_weights(ours, tmp_path / "obb.pth")
    again = load_model(tmp_path / "obb.pth")
    assert again.task == "obb"
    with torch.no_grad():
        torch.testing.assert_close(again(x), got)
    with pytest.raises(
        ValueError, match=r"holds a oriented-box \(OBB\) model .*OBBModel.*not a detection model"
    ):
        load_model(path, task="detect")


def test_fine_tuning_from_a_detection_file(tmp_path: Path) -> None:
    det_file = save_like_release(reference_task_model("detect", "n", 15), tmp_path / "det.pt")
    model = create_model("n", 15, task="obb")
    _loaded, skipped = load_pretrained(model, det_file, strict=False, warn=lambda m: None)
    assert skipped and all(k.startswith("head.cv4.") for k in skipped)  # all but the angle branch
    torch.testing.assert_close(
        model.state_dict()["head.cv3.2.2.bias"], load_model(det_file).state_dict()["head.cv3.2.2.bias"]
    )


def test_runs_of_the_task_are_accepted() -> None:
    """The module builds with the OBB metric (the CLI runs are in test_obb_resume.py)."""
    from yolo11_lightning import YOLO11Module
    from yolo11_lightning.tasks.obb.metric import ObbMAP

    module = YOLO11Module(task="obb", num_classes=15)
    assert module.task.name == "obb" and isinstance(module.val_map, ObbMAP)
