"""The pose task through the front doors: a CLI fit on the synthetic pose set, resumed 2 ranks -> 1 exactly,
``best.ckpt`` on box + pose fitness, ``predict`` writing COCO keypoints, and an ONNX export the oracle's own
client (``AutoBackend``, ``YOLO("model.onnx", task="pose")``) reads with its ``kpt_shape`` and predicts like
our PyTorch model.

The resume is the tiny run of ``tests/e2e/test_resume.py`` (``tests/helpers/scripts/tiny_fit.yaml``: 16 images of 64 px,
global batch 4, 2 batches per optimiser step, 2 epochs, mosaic closed in the last, EMA, ``last.ckpt`` after every
step): keypoints travel through mosaic, flips with ``flip_idx``, the sampler and the pose loss; the resumed run
ends in the uninterrupted run's state having trained the global sample order exactly once.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from pathlib import Path

os.environ["YOLO_OFFLINE"] = "1"  # before any import of the reference package

import cv2
import numpy as np
import pytest
import torch
from cli_runs import SCRIPTS, check_resume_two_ranks_to_one, fit_args, fit_here, load
from data_files import pattern, write_image

from yolo11_lightning.data.augment.transforms import letterbox
from yolo11_lightning.export.command import main as export_main
from yolo11_lightning.model_files.weights import load_model
from yolo11_lightning.ops.letterbox import letterbox_to_original
from yolo11_lightning.ops.postprocess import non_max_suppression
from yolo11_lightning.synthetic.poses import make_synthetic_pose_dataset
from yolo11_lightning.tasks.pose.drawing import keypoints_to_original

POSE = ["--model.task", "pose"]  # the data follows the model; kpt_shape [5, 3] follows the dataset


@pytest.fixture(scope="module")
def pose_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 train / 7 val images of 64 px (the tiny detection set's sizes), 5 keypoints per figure."""
    return make_synthetic_pose_dataset(tmp_path_factory.mktemp("tiny_pose"), 16, 7, 64, num_classes=3)


@pytest.fixture(scope="module")
def pose_uninterrupted(pose_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pose_uninterrupted")
    fit_here(fit_args(pose_dataset, root, "rec", "--ckpt_path", "last", *POSE))
    return root


def test_pose_resume_two_ranks_to_one_is_exact(
    pose_dataset: Path, pose_uninterrupted: Path, tmp_path: Path
) -> None:
    final = check_resume_two_ranks_to_one(pose_dataset, pose_uninterrupted, tmp_path, *POSE)
    assert final["hyper_parameters"]["task"] == "pose"
    assert list(final["hyper_parameters"]["kpt_shape"]) == [5, 3]


def test_pose_best_checkpoint_follows_box_plus_pose_fitness(pose_uninterrupted: Path) -> None:
    (best,) = pose_uninterrupted.rglob("best.ckpt")
    states = load(best)["callbacks"]
    (key,) = [k for k in states if k.startswith("BestCheckpoint")]
    assert "'monitor': 'val/fitness'" in key, key
    (metrics_csv,) = pose_uninterrupted.rglob("metrics.csv")
    rows = [r for r in csv.DictReader(metrics_csv.open()) if r.get("val/fitness")]
    assert rows, "val/fitness not logged"
    for r in rows:
        m = {k: float(r[f"val/{k}"]) for k in ("mAP50", "mAP50-95", "pose_mAP50", "pose_mAP50-95", "fitness")}
        expected = 0.1 * (m["mAP50"] + m["pose_mAP50"]) + 0.9 * (m["mAP50-95"] + m["pose_mAP50-95"])
        assert m["fitness"] == pytest.approx(expected, abs=1e-6)
    assert {"train/pose_loss", "train/kobj_loss"} <= set(rows[0])


def test_predict_writes_coco_keypoints_and_a_model_of_another_kpt_shape_is_refused(
    pose_dataset: Path, pose_uninterrupted: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """In this process (the CLI's ``main``): what a subprocess would add, the interpreter's start, is the
    resume test's and test_cli's."""
    from yolo11_lightning.cli.main import main

    (last,) = [p for p in pose_uninterrupted.rglob("last.ckpt") if "version_0" in str(p)]
    out = tmp_path / "pred"
    args = ["predict", "--ckpt_path", str(last), "--source", str(pose_dataset.parent / "images" / "val")]
    code = main([*args, "--out", str(out), "--image-size", "64", "--conf", "0.0001", "--max-det", "2"])
    assert code == 0, capfd.readouterr()
    rows = json.loads((out / "predictions.json").read_text())
    assert rows and all(len(r["keypoints"]) == 15 for r in rows)
    for r in rows:  # x, y in original pixels (64 x 64), the visibility score in (0, 1)
        values = np.array(r["keypoints"]).reshape(5, 3)
        assert (values[:, :2] >= 0).all() and (values[:, :2] <= 64).all() and (values[:, 2] <= 1).all()
    assert len(list(out.glob("*.png"))) == 7
    monkeypatch.syspath_prepend(str(SCRIPTS))  # tiny_fit.yaml names the test callbacks
    capfd.readouterr()
    assert main(fit_args(pose_dataset, tmp_path, "rec", *POSE, "--model.kpt_shape", "[17, 3]")) == 2
    line = capfd.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: model.kpt_shape=[17, 3] but the dataset") and "kpt_shape [5, 3]" in line
    assert not list(tmp_path.rglob("*.ckpt"))


# ------------------------------------------------------------------------------------------ ONNX
SIZE = 160
NAMES = {0: "figure", 1: "hand"}
SHAPES = [(96, 160), (160, 128), (160, 160)]


def _small_keypoint_offsets(model: torch.nn.Module, images: torch.Tensor) -> None:
    """Scale each level's keypoint output so its raw offsets stay within ±2 cells on ``images``, as a trained
    model's do (a random branch gives offsets of tens of cells: keypoints thousands of pixels away, where the
    float32 gap between ONNX Runtime and PyTorch, amplified 2·stride times by the decode, passes the export
    check's tolerance)."""
    head, outputs = model.model[-1], {}
    hooks = [
        seq[-1].register_forward_hook(lambda _m, _i, out, k=k: outputs.__setitem__(k, out))
        for k, seq in enumerate(head.cv4)
    ]
    with torch.no_grad():
        model.eval()(images)
        for hook in hooks:
            hook.remove()
        for k, seq in enumerate(head.cv4):
            gain = 2.0 / float(outputs[k].abs().max())
            seq[-1].weight.mul_(gain)
            seq[-1].bias.mul_(gain)


def test_oracle_onnx_client_reads_kpt_shape_and_predicts_our_keypoints(tmp_path: Path) -> None:
    """A reference yolo11n-pose (2 classes, kpt_shape [5, 3]), image-driven as in the detection interop test,
    saved as a release file, exported by our command; the oracle's AutoBackend reads ``kpt_shape`` from the
    metadata and its predictor gives our PyTorch model's detections and keypoints (original pixels, 1e-2)."""
    pytest.importorskip("onnxruntime")
    from model_oracle import image_driven, save_like_release
    from ultralytics import YOLO
    from ultralytics.nn.autobackend import AutoBackend
    from ultralytics.nn.tasks import PoseModel

    images = [write_image(tmp_path / f"im{i}.png", pattern(h, w, seed=i)) for i, (h, w) in enumerate(SHAPES)]
    rgbs = [np.ascontiguousarray(cv2.imread(str(p))[..., ::-1]) for p in images]
    boxed = [letterbox(rgb, SIZE) for rgb in rgbs]
    batch = torch.stack([torch.from_numpy(b).permute(2, 0, 1).float() / 255 for b, _, _ in boxed])
    torch.manual_seed(0)
    reference = PoseModel("yolo11n-pose.yaml", nc=len(NAMES), data_kpt_shape=(5, 3), verbose=False)
    image_driven(reference, batch)
    _small_keypoint_offsets(reference, batch)
    pt = save_like_release(reference, tmp_path / "pose.pt", NAMES)
    onnx = tmp_path / "pose.onnx"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert export_main(["--weights", str(pt), "--out", str(onnx), "--image-size", str(SIZE)]) == 0
    assert "task pose" in printed.getvalue()
    backend = AutoBackend(str(onnx), device=torch.device("cpu"))
    assert (backend.task, backend.names, list(backend.kpt_shape)) == ("pose", NAMES, [5, 3])

    model = load_model(pt, task="pose")
    with torch.no_grad():
        rows = non_max_suppression(
            model(batch), conf_threshold=0.5, iou_threshold=0.7, multi_label=False, extra=15
        )
    theirs = YOLO(str(onnx), task="pose").predict(
        [str(p) for p in images], imgsz=SIZE, conf=0.5, verbose=False
    )
    matched = 0
    for i, (result, det) in enumerate(zip(theirs, rows)):
        _, scale, pad = boxed[i]
        pad_t, size = torch.tensor(pad, dtype=torch.float32), torch.tensor(rgbs[i].shape[:2])
        boxes = letterbox_to_original(det[:, :4], scale, pad_t, size)
        points = keypoints_to_original(det[:, 6:].reshape(-1, 5, 3), scale, pad_t, size)
        assert len(result.boxes) == len(det)
        if not len(det):
            continue
        order = [int(torch.cdist(b[None], boxes).argmin()) for b in result.boxes.xyxy]
        torch.testing.assert_close(result.boxes.xyxy, boxes[order], atol=1e-2, rtol=0)
        torch.testing.assert_close(result.boxes.conf, det[order, 4], atol=1e-4, rtol=0)
        torch.testing.assert_close(result.keypoints.data, points[order], atol=1e-2, rtol=0)
        matched += len(det)
    assert matched >= 3


def test_model_configs_name_the_pose_task_at_every_scale() -> None:
    import yaml
    from cli_runs import REPO

    for scale in "nsmlx":
        config = yaml.safe_load((REPO / "configs" / "model" / f"yolo11{scale}-pose.yaml").read_text())
        assert config == {"model": {"scale": scale, "task": "pose"}}
    quickstart = yaml.safe_load((REPO / "configs" / "quickstart-pose.yaml").read_text())
    assert quickstart["model"]["task"] == "pose" and quickstart["data"]["dataset"] == "synthetic"
