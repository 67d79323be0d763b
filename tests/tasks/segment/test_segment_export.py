"""Export of a segmentation model: ONNX with predictions and prototypes, read by the reference's loader.

A reference yolo11n-seg (3 classes) is built with the oracle from its yaml, made image-driven (BatchNorm
statistics and class logits from the images, as in the detection interop test), saved as a reference ``.pt``,
read with our loader and exported by ``yolo11-lightning export`` at a fixed 160 x 160 input. The oracle's
``YOLO("model.onnx", task="segment")`` then predicts masks that equal ours computed from the PyTorch model.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from types import SimpleNamespace

os.environ["YOLO_OFFLINE"] = "1"  # before any import of the reference package

import numpy as np
import pytest
import torch
from data_files import pattern, write_image

from yolo11_lightning.data.augment.transforms import letterbox
from yolo11_lightning.export.command import main
from yolo11_lightning.export.onnx import onnx_output_diffs, onnx_tolerance
from yolo11_lightning.model_files.weights import load_model
from yolo11_lightning.ops.letterbox import letterbox_to_original
from yolo11_lightning.ops.postprocess import non_max_suppression
from yolo11_lightning.tasks.segment.mask_ops import crop_masks, mask_logits, masks_at_input, segment_image

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("ultralytics")

SIZE = 160
NAMES = {0: "circle", 1: "square", 2: "triangle"}
SHAPES = [(96, 160), (160, 128), (160, 160)]  # long side SIZE: letterboxing only pads, in both pipelines


def _rgb(path: Path) -> np.ndarray:
    import cv2

    return cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)


def _pair(ours: torch.Tensor, theirs: torch.Tensor) -> list[int]:
    """For each of our (n, 6) rows the index of its own row of ``theirs``: same class, boxes within 1e-2 px,
    scores within 1e-4 (order-free: near-equal scores may come in either order)."""
    free, pairs = torch.ones(len(theirs), dtype=torch.bool), []
    for row in ours:
        close = (
            free
            & (theirs[:, 5] == row[5])
            & ((theirs[:, 4] - row[4]).abs() <= 1e-4)
            & ((theirs[:, :4] - row[:4]).abs().amax(1) <= 1e-2)
        )
        assert close.any(), f"no oracle detection for ours {row.tolist()}"
        pairs.append(int(close.nonzero()[0]))
        free[pairs[-1]] = False
    return pairs


def _batch(
    paths: list[Path],
) -> tuple[torch.Tensor, list[tuple[float, tuple[int, int]]], list[tuple[int, int]]]:
    """Our letterbox of each file at SIZE: (B, 3, SIZE, SIZE) float, (scale, pad) and original (h, w)."""
    images, letterboxes, sizes = [], [], []
    for path in paths:
        rgb = _rgb(path)
        boxed, scale, pad = letterbox(rgb, SIZE)
        images.append(torch.from_numpy(boxed).permute(2, 0, 1).float() / 255)
        letterboxes.append((scale, pad))
        sizes.append(rgb.shape[:2])
    return torch.stack(images), letterboxes, sizes


@pytest.fixture(scope="module")
def seg_export(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    from model_oracle import image_driven, save_like_release
    from ultralytics.nn.tasks import SegmentationModel

    root = tmp_path_factory.mktemp("seg_export")
    images = [write_image(root / f"im{i}.png", pattern(h, w, seed=i)) for i, (h, w) in enumerate(SHAPES)]
    torch.manual_seed(0)
    reference = SegmentationModel("yolo11n-seg.yaml", nc=len(NAMES), verbose=False)
    batch, letterboxes, sizes = _batch(images)
    image_driven(reference, batch)
    pt = save_like_release(reference, root / "seg.pt", NAMES)
    onnx, printed = root / "seg.onnx", io.StringIO()
    with contextlib.redirect_stdout(printed):  # the export command, as a user runs it
        code = main(["--weights", str(pt), "--out", str(onnx), "--image-size", str(SIZE)])
    return SimpleNamespace(
        root=root, images=images, pt=pt, batch=batch, letterboxes=letterboxes, sizes=sizes, onnx=onnx,
        exit_code=code, printed=printed.getvalue(), model=load_model(pt, task="segment"),
    )  # fmt: skip


def test_export_cli_writes_a_two_output_onnx(seg_export: SimpleNamespace) -> None:
    """The export command reads the reference seg file (task from the file) and checks both outputs with
    onnxruntime; the oracle's loader reads the metadata as a segmentation model's."""
    from ultralytics.nn.autobackend import AutoBackend

    out, printed = seg_export.onnx, seg_export.printed
    assert seg_export.exit_code == 0, printed
    assert "task segment" in printed and "outputs output0 + output1" in printed
    assert "output0" in printed.split("max |diff|")[1] and "output1" in printed.split("max |diff|")[1]
    model = seg_export.model
    diffs = onnx_output_diffs(model, out, seg_export.batch)
    assert set(diffs) == {"output0", "output1"}
    assert max(diffs.values()) <= onnx_tolerance(model, seg_export.batch)
    backend = AutoBackend(str(out), device=torch.device("cpu"))
    assert (backend.task, backend.names, backend.stride, backend.dynamic) == ("segment", NAMES, 32, False)
    preds, protos = backend(seg_export.batch)
    assert preds.shape == (3, 4 + 3 + 32, 525) and protos.shape == (3, 32, SIZE // 4, SIZE // 4)


def test_oracle_predicts_our_onnx_like_ours_in_torch(seg_export: SimpleNamespace) -> None:
    """The oracle's predictor on our ONNX file: the same detections as ours from the PyTorch model (boxes in
    original pixels within 1e-2, scores within 1e-4, detections with empty masks dropped alike) and masks at
    the input size pixel-equal to ours: as computed by ``masks_at_input`` when the image has 50 detections or
    more (the oracle's vectorised crop), with box edges rounded at proto resolution below that (its CPU crop
    for fewer masks)."""
    from ultralytics import YOLO

    sources = [str(p) for p in seg_export.images]
    theirs = YOLO(str(seg_export.onnx), task="segment").predict(sources, imgsz=SIZE, conf=0.5, verbose=False)
    with torch.no_grad():
        preds, protos = seg_export.model(seg_export.batch)
    ours = non_max_suppression(preds, conf_threshold=0.5, iou_threshold=0.7, multi_label=False, extra=32)
    ratio = protos.shape[-1] / SIZE
    ious, rounded = [], []
    for i, (result, det) in enumerate(zip(theirs, ours)):
        scale, pad = seg_export.letterboxes[i]
        pad = torch.tensor(pad, dtype=torch.float32)
        boxes, masks = segment_image(det, protos[i], (SIZE, SIZE), seg_export.sizes[i], scale, pad)
        plain = masks_at_input(protos[i], det[:, 6:], det[:, :4], (SIZE, SIZE))
        assert len(boxes) == len(masks) == int(plain.flatten(1).any(1).sum())
        assert masks.shape[1:] == seg_export.sizes[i]
        same_rule = plain
        if (
            len(det) < 50
        ):  # its CPU crop for fewer than 50 masks rounds the box edges at proto resolution first
            rounded.append(i)
            logits = crop_masks(mask_logits(protos[i], det[:, 6:]), (det[:, :4] * ratio).round())
            same_rule = torch.nn.functional.interpolate(logits[None], (SIZE, SIZE), mode="bilinear")[0] > 0
        keep = same_rule.flatten(1).any(1)  # both drop detections whose mask is empty
        kept = det[keep].clone()
        kept[:, :4] = letterbox_to_original(kept[:, :4], scale, pad, torch.tensor(seg_export.sizes[i]))
        assert result.masks is not None and 5 <= len(result.boxes) == len(kept)
        rows = torch.cat((result.boxes.xyxy, result.boxes.conf[:, None], result.boxes.cls[:, None]), 1)
        pairs = _pair(kept[:, :6], rows)  # ours[k] <-> theirs[pairs[k]]: same class, boxes and scores close
        their_masks = result.masks.data.bool()[pairs]  # at the input size, as its predictor keeps them
        differ = (same_rule[keep] != their_masks).flatten(1).sum(1)
        assert int(differ.max()) <= 2, f"image {i}: {differ.tolist()} pixels differ"  # ONNX vs torch logits
        plain = plain[keep]
        inter, union = (plain & their_masks).flatten(1).sum(1), (plain | their_masks).flatten(1).sum(1)
        ious += (inter / union).tolist()
        print(f"image {i}: {len(det)} detections, {len(boxes)} masks ours, {len(kept)} theirs, "
              f"{int(differ.sum())} pixels differ")  # fmt: skip
        assert their_masks.float().mean() > 0.002
    # A figure, not a check: the rounding moves a tiny box's edges by up to half its size.
    print(f"mask IoU ours (unrounded crop) vs oracle: min {min(ious):.4f}, mean {np.mean(ious):.4f}")
    assert 0 < len(rounded) < len(SHAPES), "both of the oracle's crop rules should be exercised"


def test_onnx_runner_returns_predictions_and_protos(seg_export: SimpleNamespace) -> None:
    from yolo11_lightning.model_files.onnx_runtime import OnnxDetector

    runner = OnnxDetector(seg_export.onnx, num_classes=3, task="segment")
    assert OnnxDetector(seg_export.onnx, task=None).task == "segment"
    with pytest.raises(
        ValueError, match=r"seg\.onnx: holds a segment model \(2 outputs\), not a detect model"
    ):
        OnnxDetector(seg_export.onnx)  # the default, as detection validate/predict use it today
    assert (runner.task, runner.num_classes, runner.num_masks, runner.names) == (
        "segment",
        3,
        32,
        list(NAMES.values()),
    )
    preds, protos = runner(seg_export.batch)
    with torch.no_grad():
        expected_preds, expected_protos = seg_export.model(seg_export.batch)
    tolerance = onnx_tolerance(seg_export.model, seg_export.batch)
    assert float((preds - expected_preds).abs().max()) <= tolerance
    assert float((protos - expected_protos).abs().max()) <= tolerance


def test_dynamic_seg_export_takes_other_sizes(seg_export: SimpleNamespace) -> None:
    """``dynamic=True``: free height and width on both outputs; another size matches PyTorch."""
    from ultralytics.nn.autobackend import AutoBackend

    from yolo11_lightning.export.onnx import export_onnx

    path = export_onnx(seg_export.model, seg_export.root / "dynamic.onnx", SIZE, dynamic=True)
    x = torch.rand(1, 3, 96, 192, generator=torch.Generator().manual_seed(3))
    diffs = onnx_output_diffs(seg_export.model, path, x)
    assert max(diffs.values()) <= onnx_tolerance(seg_export.model, x)
    backend = AutoBackend(str(path), device=torch.device("cpu"))
    assert (backend.task, backend.dynamic) == ("segment", True)
    preds, protos = backend(x)
    assert preds.shape == (1, 39, 12 * 24 + 6 * 12 + 3 * 6) and protos.shape == (1, 32, 24, 48)


def _predicted_seg_dataset(seg_export: SimpleNamespace, root: Path) -> Path:
    """A YOLO-seg dataset of the fixture's images labelled with the PyTorch model's own confident detections,
    each instance's polygon its box's four corners, so that box mAP is high and mask mAP (the model's masks
    fill part of their boxes) is not 0 for ``--check-data``."""
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    with torch.no_grad():
        preds, _ = seg_export.model(seg_export.batch)
    rows = non_max_suppression(preds, conf_threshold=0.25, iou_threshold=0.3, multi_label=False, extra=32)
    for i, (path, det) in enumerate(zip(seg_export.images, rows)):
        scale, pad = seg_export.letterboxes[i]
        h, w = seg_export.sizes[i]
        boxes = letterbox_to_original(
            det[:8, :4].clone(), scale, torch.tensor(pad, dtype=torch.float32), torch.tensor((h, w))
        )
        lines = []
        for cls, (x1, y1, x2, y2) in zip(det[:8, 5].tolist(), (boxes / torch.tensor([w, h, w, h])).tolist()):
            lines.append(" ".join([str(int(cls))] + [f"{v:.6f}" for v in (x1, y1, x2, y1, x2, y2, x1, y2)]))
        (root / "images" / path.name).write_bytes(path.read_bytes())
        (root / "labels" / f"{path.stem}.txt").write_text("\n".join(lines) + "\n")
    yaml_path = root / "data.yaml"
    names = "".join(f"  {k}: {v}\n" for k, v in NAMES.items())
    yaml_path.write_text(f"path: {root}\ntrain: images\nval: images\nnames:\n{names}")
    return yaml_path


def test_seg_export_check_data_compares_box_and_mask_map(
    seg_export: SimpleNamespace, capsys: pytest.CaptureFixture
) -> None:
    """``--format weights`` keeps the task; ``export --check-data`` on a segmenter validates the checkpoint and
    the ONNX file on the segmentation val split and compares box and mask mAP."""
    out = seg_export.root / "seg.pth"
    assert main(["--weights", str(seg_export.pt), "--format", "weights", "--out", str(out)]) == 0
    assert "task segment" in capsys.readouterr().out
    assert load_model(out, task=None).task == "segment"
    data = _predicted_seg_dataset(seg_export, seg_export.root / "predicted")
    args = ["--weights", str(out), "--check-data", str(data), "--out", str(seg_export.root / "checked.onnx"),
            "--image-size", str(SIZE), "--batch-size", "2", "--num-workers", "0", "--accelerator", "cpu"]  # fmt: skip
    assert main(args) == 0, capsys.readouterr()
    printed = capsys.readouterr().out
    lines = [line.split() for line in printed.splitlines()]
    (header,) = [line for line in lines if line[:1] == ["mAP50-95"]]
    rows = {line[0]: dict(zip(header, map(float, line[1:]))) for line in lines if line[:1] in
            (["checkpoint"], ["onnx"], ["difference"])}  # fmt: skip
    assert header == ["mAP50-95", "mAP50", "mask_mAP50-95", "mask_mAP50"], printed
    # 0.70 and 0.04 here: the image-driven model's masks are blobs inside its boxes.
    assert rows["checkpoint"]["mAP50-95"] > 0.3 and rows["checkpoint"]["mask_mAP50-95"] > 0.01, printed
    assert max(abs(v) for v in rows["difference"].values()) <= 1e-3, printed

    # A disagreement beyond the allowed difference fails, naming the metric.
    strict = [*args, "--max-map-difference", "-1"]
    assert main(strict) == 1
    assert "mAP50-95 differs from the checkpoint's by" in capsys.readouterr().err
