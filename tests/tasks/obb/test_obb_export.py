"""Export of an oriented-box model: ONNX (B, 4 + nc + 1, A) with its task metadata, run by the oracle's client.

A reference yolo11n-obb (3 classes) is built with the oracle from its yaml, made image-driven (BatchNorm statistics
and class logits from the images, as in the detection interop test), saved as a reference ``.pt``, read with our
loader and exported by ``yolo11-lightning export`` at a fixed 128 x 128 input. The oracle's
``YOLO("model.onnx", task="obb")`` then predicts the rotated boxes ours give from the PyTorch model, and
``export --check-data`` compares the OBB mAP of the checkpoint and the ONNX file.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from types import SimpleNamespace

os.environ["YOLO_OFFLINE"] = "1"  # before any import of the reference package

import pytest
import torch
from data_files import pattern, write_image

from yolo11_lightning.data.augment.transforms import letterbox
from yolo11_lightning.export.command import main
from yolo11_lightning.export.onnx import onnx_output_diffs, onnx_tolerance
from yolo11_lightning.model_files.weights import load_model
from yolo11_lightning.tasks import get_task
from yolo11_lightning.tasks.obb.nms import rotated_nms
from yolo11_lightning.tasks.obb.rotated import corners

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("ultralytics")

SIZE = 128
NAMES = {0: "plane", 1: "ship", 2: "car"}
SHAPES = [(80, 128), (128, 96), (128, 128)]  # long side SIZE: letterboxing only pads, in both pipelines


def _rgb(path: Path):
    import cv2

    return cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)


@pytest.fixture(scope="module")
def obb_export(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    from model_oracle import image_driven, save_like_release
    from ultralytics.nn.tasks import OBBModel

    root = tmp_path_factory.mktemp("obb_export")
    images = [write_image(root / f"im{i}.png", pattern(h, w, seed=i)) for i, (h, w) in enumerate(SHAPES)]
    batch, scales, pads, sizes = [], [], [], []
    for path in images:
        rgb = _rgb(path)
        boxed, scale, pad = letterbox(rgb, SIZE)
        batch.append(torch.from_numpy(boxed).permute(2, 0, 1).float() / 255)
        scales.append(scale)
        pads.append(pad)
        sizes.append(rgb.shape[:2])
    batch = torch.stack(batch)
    # Seed 6: a random network made image-driven is well conditioned here (float32 within 7e-5 of float64 on
    # these images; other seeds reach 1e-3 on 70 px boxes, over the export check's tolerance, detection alike).
    torch.manual_seed(6)
    reference = OBBModel("yolo11n-obb.yaml", nc=len(NAMES), verbose=False)
    image_driven(reference, batch)
    pt = save_like_release(reference, root / "obb.pt", NAMES)
    onnx, printed = root / "obb.onnx", io.StringIO()
    with contextlib.redirect_stdout(printed):  # the export command, as a user runs it
        code = main(["--weights", str(pt), "--out", str(onnx), "--image-size", str(SIZE)])
    return SimpleNamespace(
        root=root, images=images, pt=pt, batch=batch, onnx=onnx, exit_code=code, printed=printed.getvalue(),
        model=load_model(pt, task="obb"), scales=torch.tensor(scales, dtype=torch.float32),
        pads=torch.tensor(pads, dtype=torch.float32), sizes=torch.tensor(sizes),
    )  # fmt: skip


def test_export_writes_the_obb_output_with_its_metadata(obb_export: SimpleNamespace) -> None:
    from ultralytics.nn.autobackend import AutoBackend

    assert obb_export.exit_code == 0, obb_export.printed
    assert "task obb" in obb_export.printed
    diffs = onnx_output_diffs(obb_export.model, obb_export.onnx, obb_export.batch)
    assert max(diffs.values()) <= onnx_tolerance(obb_export.model, obb_export.batch)
    backend = AutoBackend(str(obb_export.onnx), device=torch.device("cpu"))
    assert (backend.task, backend.names, backend.stride) == ("obb", NAMES, 32)
    preds = backend(obb_export.batch)
    preds = preds[0] if isinstance(preds, list | tuple) else preds
    assert preds.shape == (3, 4 + 3 + 1, sum((SIZE // s) ** 2 for s in (8, 16, 32)))


def test_oracle_predicts_our_onnx_like_ours_in_torch(obb_export: SimpleNamespace) -> None:
    """The oracle's predictor on our ONNX file gives the rotated boxes our predict gives from the PyTorch model
    (``ObbTask.predict``: regularised, in original pixels): centres and sides within 1e-2 px, angles within 1e-4,
    scores within 1e-4, same classes."""
    from ultralytics import YOLO

    sources = [str(p) for p in obb_export.images]
    theirs = YOLO(str(obb_export.onnx), task="obb").predict(sources, imgsz=SIZE, conf=0.5, verbose=False)
    task = get_task("obb")
    with torch.no_grad():
        preds = obb_export.model(obb_export.batch)
    module = SimpleNamespace(forward_with_nms=lambda _images: rotated_nms(preds, 0.5, 0.7, multi_label=False))
    batch = {"images": obb_export.batch, "scales": obb_export.scales, "pads": obb_export.pads,
             "orig_sizes": obb_export.sizes}  # fmt: skip
    compared = 0
    for ours, result in zip(task.predict(module, batch), theirs):
        rows = torch.cat((result.obb.xywhr, result.obb.conf[:, None], result.obb.cls[:, None]), 1)
        mine = torch.cat((ours["rboxes"], ours["detections"][:, 4:6]), 1)
        assert len(mine) == len(rows) >= 2
        for row in mine:  # order-free: near-equal scores may come in either order
            close = (
                (rows[:, 6] == row[6])
                & ((rows[:, 5] - row[5]).abs() <= 1e-4)
                & ((rows[:, :4] - row[:4]).abs().amax(1) <= 1e-2)
                & ((rows[:, 4] - row[4]).abs() <= 1e-4)
            )
            assert close.any(), f"no oracle detection for ours {row.tolist()}"
        compared += len(mine)
    assert compared >= 6


def test_export_check_data_reports_obb_map(
    obb_export: SimpleNamespace, capsys: pytest.CaptureFixture
) -> None:
    """``export --check-data`` on an OBB set labelled with the model's own confident rotated boxes: the
    checkpoint's and the ONNX file's OBB mAP, equal within 1e-3 (and high: the labels are its detections)."""
    root = obb_export.root / "predicted"
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    with torch.no_grad():
        preds = obb_export.model(obb_export.batch)
    task = get_task("obb")
    module = SimpleNamespace(
        forward_with_nms=lambda _images: rotated_nms(preds, 0.25, 0.3, multi_label=False)
    )
    batch = {"images": obb_export.batch, "scales": obb_export.scales, "pads": obb_export.pads,
             "orig_sizes": obb_export.sizes}  # fmt: skip
    for path, result, (h, w) in zip(
        obb_export.images, task.predict(module, batch), obb_export.sizes.tolist()
    ):
        lines = []
        for box, cls in zip(result["rboxes"][:8], result["detections"][:8, 5].tolist()):
            quad = (corners(box) / torch.tensor([w, h])).clamp(0, 1).reshape(-1).tolist()
            lines.append(" ".join([str(int(cls))] + [f"{v:.6f}" for v in quad]))
        (root / "images" / path.name).write_bytes(path.read_bytes())
        (root / "labels" / f"{path.stem}.txt").write_text("\n".join(lines) + "\n")
    names = "".join(f"  {k}: {v}\n" for k, v in NAMES.items())
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images\nval: images\nnames:\n{names}")
    args = ["--weights", str(obb_export.pt), "--check-data", str(root / "data.yaml"), "--out",
            str(obb_export.root / "checked.onnx"), "--image-size", str(SIZE), "--batch-size", "2",
            "--num-workers", "0", "--accelerator", "cpu"]  # fmt: skip
    assert main(args) == 0, capsys.readouterr()
    printed = capsys.readouterr().out
    lines = [line.split() for line in printed.splitlines()]
    (header,) = [line for line in lines if line[:1] == ["mAP50-95"]]
    rows = {line[0]: dict(zip(header, map(float, line[1:]))) for line in lines if line[:1] in
            (["checkpoint"], ["onnx"], ["difference"])}  # fmt: skip
    assert header == ["mAP50-95", "mAP50"], printed
    assert rows["checkpoint"]["mAP50-95"] > 0.3, printed
    assert max(abs(v) for v in rows["difference"].values()) <= 1e-3, printed
