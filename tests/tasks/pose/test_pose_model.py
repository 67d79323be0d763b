"""YOLO11-pose: sizes against the reference, eval outputs equal to the reference's on the same weights, the
reference's files read by the guarded reader (task, kpt_shape, names), kpt_shape kept by our files, fine-tuning
from another task's file, and runs refused until the pose data exists."""

from __future__ import annotations

import copy
import os
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")  # before any import of the reference package

import pytest
import torch
from model_oracle import reference_task_model, save_like_release

from yolo11_lightning import YOLO11
from yolo11_lightning.model_files.weights import (
    WeightsMismatchError,
    load_model,
    load_pretrained,
    save_weights,
)
from yolo11_lightning.tasks import create_model, get_task
from yolo11_lightning.tasks.pose.head import Pose, PoseOutput

# Exact parameter counts of the reference YOLO11-pose at nc=1, kpt_shape (17, 3) (docs/reference.md).
POSE_PARAMS = {"n": 2_874_462, "s": 9_918_238, "m": 20_912_364, "l": 26_169_836, "x": 58_798_636}
INPUT_SHAPE = (2, 3, 64, 96)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def num_anchors(h: int, w: int) -> int:
    return sum((h // s) * (w // s) for s in (8, 16, 32))


@pytest.mark.parametrize("scale", list(POSE_PARAMS))
def test_parameter_counts_match_reference(scale: str) -> None:
    with torch.device("meta"):
        ours = create_model(scale, 1, task="pose")
    assert ours.kpt_shape == (17, 3) and n_params(ours) == POSE_PARAMS[scale]
    ref = reference_task_model("pose", scale, 1, device="meta")
    # Same layout and order: the same state-dict shapes entry by entry (our keys are a prefix rename).
    assert [tuple(v.shape) for v in ours.state_dict().values()] == [
        tuple(v.shape) for v in ref.state_dict().values()
    ]


def test_other_keypoint_shapes_match_reference() -> None:
    for kpt_shape, nc in (((5, 2), 3), ((21, 3), 80)):
        with torch.device("meta"):
            ours = create_model("s", nc, task="pose", kpt_shape=kpt_shape)
        ref = reference_task_model("pose", "s", nc, device="meta", data_kpt_shape=kpt_shape)
        assert [tuple(v.shape) for v in ours.state_dict().values()] == [
            tuple(v.shape) for v in ref.state_dict().values()
        ]


def test_eval_outputs_equal_the_reference_on_its_weights() -> None:
    """The oracle's state dict through our mapping (``load_model`` of a plain state dict): same outputs."""
    h, w = INPUT_SHAPE[2:]
    for kpt_shape, nc in (((17, 3), 1), ((5, 2), 3)):
        ref = reference_task_model("pose", "n", nc, seed=nc, data_kpt_shape=kpt_shape).eval()
        ours = load_model(ref.state_dict()).eval()
        assert (ours.task, ours.kpt_shape, ours.num_classes) == ("pose", kpt_shape, nc)
        x = torch.rand(INPUT_SHAPE, generator=torch.Generator().manual_seed(nc))
        with torch.no_grad():
            expected, (_maps, raw) = ref(x)
            got = ours(x)
            train_out = ours.train_outputs(x)
        nk = kpt_shape[0] * kpt_shape[1]
        assert got.shape == expected.shape == (2, 4 + nc + nk, num_anchors(h, w))
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)  # boxes and keypoints in pixels
        torch.testing.assert_close(train_out.keypoints, raw, rtol=1e-5, atol=1e-5)
        assert expected[:, 4 + nc :].std() > 1.0  # keypoints spread over the image: a non-trivial check


def test_output_contract() -> None:
    torch.manual_seed(0)
    model = create_model("n", 2, task="pose", kpt_shape=(4, 3))
    x = torch.rand(INPUT_SHAPE)
    h, w = INPUT_SHAPE[2:]
    with torch.no_grad():
        out = model.train()(x)
        assert isinstance(out, PoseOutput) and isinstance(model.head, Pose)
        assert [tuple(m.shape) for m in out.maps] == [(2, 64 + 2, h // s, w // s) for s in (8, 16, 32)]
        assert out.keypoints.shape == (2, 12, num_anchors(h, w))
        preds = model.eval()(x)
        raw = model.train_outputs(x)
    torch.testing.assert_close(preds[:, :6], model.head.decode(raw.maps))
    visibility = preds[:, 6:].unflatten(1, (4, 3))[:, :, 2]
    assert ((visibility > 0) & (visibility < 1)).all()
    with pytest.raises(ValueError, match=r"kpt_shape must be \[K, D\]"):
        create_model("n", 1, task="pose", kpt_shape=(17, 4))
    with pytest.raises(ValueError, match="kpt_shape is for pose models; a detection model has none"):
        create_model("n", 1, kpt_shape=(17, 3))


def test_fuse_and_reset_head_keep_the_keypoints() -> None:
    model = reference_task_model("pose", "n", 1, seed=3)
    ours = load_model(model.state_dict()).eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        before = ours(x)
        after = copy.deepcopy(ours).fuse()(x)
    torch.testing.assert_close(after, before, atol=1e-3, rtol=1e-4)
    keypoint_weight = ours.head.cv4[0][2].weight.clone()
    ours.reset_head(3)
    assert torch.equal(ours.head.cv4[0][2].weight, keypoint_weight)
    with torch.no_grad():
        assert ours(x).shape == (1, 4 + 3 + 51, num_anchors(64, 64))


def test_reference_files_read_by_the_guarded_reader(tmp_path: Path) -> None:
    """Release-style files (pickled PoseModel in fp16): task, kpt_shape, class count and names read from the file
    by the restricted unpickler, outputs within 1e-3 of the reference's (fp16 weights)."""
    for kpt_shape, nc in (((17, 3), 1), ((6, 2), 2)):  # (6, 2): K·D = 12 alone would read as (4, 3)
        ref = reference_task_model("pose", "n", nc, seed=5, data_kpt_shape=kpt_shape)
        path = save_like_release(ref, tmp_path / f"pose{nc}.pt", {i: f"kind_{i}" for i in range(nc)})
        ours = load_model(path, task=None)
        assert (ours.task, ours.kpt_shape, ours.num_classes) == ("pose", kpt_shape, nc)
        assert ours.names == [f"kind_{i}" for i in range(nc)]
        x = torch.rand(INPUT_SHAPE, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            expected = copy.deepcopy(ref).half().float().eval()(x)[0]
            got = ours(x)
        assert (got - expected).abs().max() <= 1e-3
    # A plain state dict says nothing but its shapes: K·D = 12 reads as (4, 3).
    assert load_model(ref.state_dict()).kpt_shape == (4, 3)
    with pytest.raises(
        ValueError, match=r"holds a keypoint \(pose\) model .*PoseModel.*not a detection model"
    ):
        load_model(path, task="detect")


def test_our_files_keep_the_keypoint_shape(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = create_model("n", 2, ["a", "b"], task="pose", kpt_shape=(6, 2))
    save_weights(model, tmp_path / "pose.pth")
    payload = torch.load(tmp_path / "pose.pth", weights_only=True)
    assert payload["task"] == "pose" and payload["kpt_shape"] == [6, 2]
    assert "kpt_shape" not in torch.load(save_weights(YOLO11("n", 2), tmp_path / "d.pth"), weights_only=True)
    loaded = load_model(tmp_path / "pose.pth")
    assert (loaded.task, loaded.kpt_shape, loaded.names) == ("pose", (6, 2), ["a", "b"])
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model.eval()(x))
    # A Lightning checkpoint holds it in its hyper-parameters, beside num_classes.
    checkpoint = {
        "hyper_parameters": {"scale": "n", "num_classes": 2, "task": "pose", "kpt_shape": [6, 2]},
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
    }
    torch.save(checkpoint, tmp_path / "x.ckpt")
    assert load_model(tmp_path / "x.ckpt").kpt_shape == (6, 2)


def test_fine_tuning_from_another_tasks_file(tmp_path: Path) -> None:
    det_file = save_like_release(reference_task_model("detect", "n", 80), tmp_path / "det.pt")
    with pytest.raises(
        WeightsMismatchError, match=r"det\.pt.*holds a detection model .*not a keypoint \(pose\)"
    ):
        load_pretrained(create_model("n", 1, task="pose"), det_file)
    model = create_model("n", 1, task="pose")
    with pytest.warns(UserWarning, match=r"loaded \d+ of \d+ tensors .*holds a detection model"):
        _loaded, skipped = load_pretrained(model, det_file, strict=False)
    # Everything but the class branch (80 -> 1 classes) and the keypoint branch.
    assert skipped and all(k.startswith(("head.cv3.", "head.cv4.")) for k in skipped)
    pose_file = save_like_release(reference_task_model("pose", "n", 1), tmp_path / "pose.pt")
    detector = YOLO11("n", 1)
    _loaded, skipped = load_pretrained(
        detector, pose_file, strict=False, warn=lambda m: None, info=lambda m: None
    )
    assert not skipped  # a detector is a pose model minus the keypoints


def test_pose_module_takes_its_kpt_shape_and_refuses_a_bad_one_in_one_line() -> None:
    from yolo11_lightning import YOLO11Module
    from yolo11_lightning.errors import UserInputError

    module = YOLO11Module(task="pose", num_classes=1, kpt_shape=[5, 3])
    assert module.model.kpt_shape == (5, 3) and module.task.extra_channels(module.model) == 15
    with pytest.raises(UserInputError, match=r"^model.kpt_shape: kpt_shape must be \[K, D\]"):
        YOLO11Module(task="pose", num_classes=1, kpt_shape=[5, 4])


def test_pose_options_travel_through_the_task_and_a_bad_one_names_its_file() -> None:
    """What a model file keeps of the task's options rebuilds the same model; a file without them gets what its
    tensors imply; a bad value names the file; a task without options keeps and takes none."""
    pose, detect = get_task("pose"), get_task("detect")
    model = create_model("n", 2, task="pose", kpt_shape=(6, 2))
    kept = pose.model_options(model)
    assert kept == {"kpt_shape": [6, 2]}
    assert create_model("n", 2, task="pose", **pose.options_from(kept, "w.pt")).kpt_shape == (6, 2)
    assert pose.options_from({}, "w.pt", model.state_dict()) == {"kpt_shape": (4, 3)}  # K·D = 12 alone
    assert pose.options_from({"kpt_shape": None}, "w.pt") == {}  # the default, (17, 3)
    with pytest.raises(ValueError, match=r"^m\.onnx: ONNX metadata: kpt_shape must be \[K, D\]"):
        pose.options_from({"kpt_shape": [5]}, "m.onnx: ONNX metadata")
    assert detect.model_options(create_model("n", 2)) == {}
    assert detect.options_from({"kpt_shape": [5, 3]}, "w.pt") == {}
