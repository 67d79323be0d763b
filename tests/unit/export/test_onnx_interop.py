"""Our exports in the reference ecosystem and in our own validation (issue 15, items 4 and 5; issue 43: TorchScript,
OpenVINO and INT8 files beside the ONNX ones).

One tiny reference YOLO11n is built with the oracle (random weights made image-driven: BatchNorm statistics
from the images themselves and class logits spread to N(-3, 2), so scores rank detections by image content
instead of by float rounding), saved as a reference ``.pt``, read with our loader and exported with our
exporter at a fixed 160x160 input and with free height and width. Its validation labels are its own
detections, every other one shifted, so mAP sits well inside (0, 1) and moves with any box or score change.
The oracle (YOLO_OFFLINE) then predicts and validates our files; our validate runs them through ONNX Runtime.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

os.environ["YOLO_OFFLINE"] = "1"  # before any import of the reference package

from data_files import pattern, write_image, write_labels, write_yaml

from yolo11_lightning.export.onnx import export_onnx, onnx_tolerance
from yolo11_lightning.model_files.weights import load_model

pytest.importorskip("onnxruntime")
pytest.importorskip("ultralytics")

SIZE = 160
NAMES = {0: "circle", 1: "square", 2: "triangle"}
# Long side = SIZE: square letterboxing only pads (no resize), the same in the oracle's predictor and validator.
SHAPES = [(64, 160), (160, 96), (160, 160), (100, 160), (160, 64), (120, 160), (160, 128), (80, 160)]


def cv2_rgb(path: Path) -> np.ndarray:
    """An image file as (H, W, 3) RGB uint8."""
    import cv2

    return cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)


def _square_letterbox(image: np.ndarray) -> torch.Tensor:
    """(h, w, 3) uint8 with max(h, w) = SIZE -> (3, SIZE, SIZE) float, centred on grey 114."""
    h, w = image.shape[:2]
    canvas = np.full((SIZE, SIZE, 3), 114, np.uint8)
    top, left = round((SIZE - h) / 2 - 0.1), round((SIZE - w) / 2 - 0.1)
    canvas[top : top + h, left : left + w] = image
    return torch.from_numpy(canvas).permute(2, 0, 1).float() / 255


def _write_dataset(root: Path, arrays: list[np.ndarray], detections: list[list[tuple]], seed: int) -> Path:
    """Images and labels made of detections ``(x1, y1, x2, y2, class)`` in pixels; returns the data yaml.

    Only boxes clear of the image border are kept (validators differ in whether they clip predictions, which
    is not what these tests are about), at most 10 per image; every other one is shifted by up to 20 % of its
    width, so IoUs spread over the 0.5-0.95 thresholds.
    """
    rng = np.random.default_rng(seed)
    for i, (array, boxes) in enumerate(zip(arrays, detections)):
        write_image(root / "images" / "val" / f"im{i}.png", array)
        h, w = array.shape[:2]
        inside = [(x1 / w, y1 / h, x2 / w, y2 / h, c) for x1, y1, x2, y2, c in boxes
                  if x1 > 1 and y1 > 1 and x2 < w - 1 and y2 < h - 1]  # fmt: skip
        rows = []
        for j, (x1, y1, x2, y2, c) in enumerate(inside[:10]):
            if j % 2:
                dx = rng.uniform(-0.2, 0.2) * (x2 - x1)
                x1, x2 = max(x1 + dx, 0.0), min(x2 + dx, 1.0)
            rows.append(f"{int(c)} {(x1 + x2) / 2:.6f} {(y1 + y2) / 2:.6f} {x2 - x1:.6f} {y2 - y1:.6f}")
        assert rows, f"im{i}: the model detects nothing to label"
        write_labels(root / "labels" / "val" / f"im{i}.txt", rows)
    split = {"path": str(root), "train": "images/val", "val": "images/val", "names": NAMES}
    return write_yaml(root / "data.yaml", split)


@pytest.fixture(scope="module")
def interop(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """Reference ``.pt``, two datasets of the same images and our two ONNX exports.

    ``data``: labels from the reference's square-letterbox detections (its predictor at 160 px); ``data_rect``:
    labels from its rectangular-batch validation detections. A random net reacts to the padding, so each
    mode gets labels of its own and scores well inside (0, 1).
    """
    import json

    from model_oracle import image_driven, reference_model, save_like_release
    from ultralytics import YOLO

    root = tmp_path_factory.mktemp("onnx_interop")
    arrays = [pattern(h, w, seed=i) for i, (h, w) in enumerate(SHAPES)]
    reference = reference_model("n", len(NAMES), seed=0)
    image_driven(reference, torch.stack([_square_letterbox(a) for a in arrays]))
    pt = save_like_release(reference, root / "reference.pt", NAMES)
    images = [write_image(root / "predict" / f"im{i}.png", a) for i, a in enumerate(arrays)]
    square = [
        [(*box, c) for box, c in zip(r.boxes.xyxy.tolist(), r.boxes.cls.tolist())]
        for r in YOLO(str(pt)).predict([str(p) for p in images], imgsz=SIZE, conf=0.25, verbose=False)
    ]
    data = _write_dataset(root / "square", arrays, square, seed=0)
    YOLO(str(pt)).val(data=str(data), imgsz=SIZE, batch=4, workers=0, plots=False, verbose=False, save_json=True,
                      project=str(root), name="rect_predictions")  # fmt: skip
    found = json.loads((root / "rect_predictions" / "predictions.json").read_text())
    rect = [[] for _ in arrays]
    for row in sorted(found, key=lambda r: -r["score"]):
        x, y, w, h = row["bbox"]
        if row["score"] >= 0.25:  # category ids count from 1 in the reference's json
            rect[int(row["image_id"][2:])].append((x, y, x + w, y + h, row["category_id"] - 1))
    data_rect = _write_dataset(root / "rect", arrays, rect, seed=1)
    model = load_model(pt)
    fixed = export_onnx(model, root / "fixed.onnx", SIZE)
    dynamic = export_onnx(model, root / "dynamic.onnx", SIZE, dynamic=True)
    return SimpleNamespace(root=root, images=images, pt=pt, data=data, data_rect=data_rect, model=model,
                           fixed=fixed, dynamic=dynamic)  # fmt: skip


def _oracle_val(weights: Path, data: Path, **kwargs) -> float:
    from ultralytics import YOLO

    metrics = YOLO(str(weights), task="detect").val(
        data=str(data), imgsz=SIZE, batch=4, workers=0, plots=False, verbose=False, **kwargs
    )
    return float(metrics.box.map)


def test_reference_loader_reads_our_metadata(interop: SimpleNamespace) -> None:
    from ultralytics.nn.autobackend import AutoBackend

    for path, dynamic in ((interop.fixed, False), (interop.dynamic, True)):
        backend = AutoBackend(str(path), device=torch.device("cpu"))
        assert (backend.stride, backend.task, backend.names, backend.dynamic) == (
            32,
            "detect",
            NAMES,
            dynamic,
        )
        assert list(backend.imgsz) == [SIZE, SIZE] and backend.batch == 1
        shape = (2, 3, SIZE, SIZE) if not dynamic else (2, 3, 96, SIZE)
        x = torch.rand(*shape, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            expected = interop.model(x)
        got = backend(x)
        got = got[0] if isinstance(got, list | tuple) else got
        assert got.shape == expected.shape == (2, 4 + len(NAMES), expected.shape[2])
        assert float((got - expected).abs().max()) <= onnx_tolerance(interop.model, x)


def _rows(boxes) -> np.ndarray:
    """(n, 6) x1 y1 x2 y2 score class of an oracle ``Boxes``."""
    return torch.cat((boxes.xyxy, boxes.conf[:, None], boxes.cls[:, None]), 1).cpu().numpy()


def _same_detections(got: np.ndarray, expected: np.ndarray, box_tol: float, score_tol: float) -> str | None:
    """None when every row of ``got`` pairs with its own row of ``expected`` (same class, boxes within
    ``box_tol`` px, scores within ``score_tol``), else what differs. Order-free: equal scores may come in
    any order."""
    if got.shape != expected.shape:
        return f"{len(got)} detections vs {len(expected)}"
    free = np.ones(len(expected), bool)
    for row in got[np.argsort(-got[:, 4], kind="stable")]:
        close = (
            free
            & (expected[:, 5] == row[5])
            & (np.abs(expected[:, 4] - row[4]) <= score_tol)
            & (np.abs(expected[:, :4] - row[:4]).max(1) <= box_tol)
        )
        if not close.any():
            return f"no match for {row.round(4).tolist()}"
        free[np.flatnonzero(close)[0]] = False
    return None


def test_oracle_predicts_our_onnx_as_its_pt_and_as_ours_in_torch(interop: SimpleNamespace) -> None:
    """End to end, the oracle's predictor gives the same detections from our files as from its ``.pt``; on one
    input batch, its ONNX backend and NMS give ours in torch (our NMS with the predictor's single-label rule).

    The second part leaves the image pipeline out (letterboxing parity is tested with the validator)."""
    from ultralytics import YOLO
    from ultralytics.nn.autobackend import AutoBackend
    from ultralytics.utils import nms as reference_nms

    from yolo11_lightning.ops.postprocess import non_max_suppression

    sources = [str(p) for p in interop.images]
    theirs_pt = YOLO(str(interop.pt)).predict(sources, imgsz=SIZE, conf=0.25, verbose=False)
    batch = torch.stack([_square_letterbox(cv2_rgb(p)) for p in interop.images])
    with torch.no_grad():
        ours = non_max_suppression(
            interop.model(batch), conf_threshold=0.25, iou_threshold=0.7, multi_label=False
        )
    for onnx in (interop.fixed, interop.dynamic):
        theirs_onnx = YOLO(str(onnx), task="detect").predict(sources, imgsz=SIZE, conf=0.25, verbose=False)
        for path, a, b in zip(sources, theirs_onnx, theirs_pt):
            problem = _same_detections(_rows(a.boxes), _rows(b.boxes), box_tol=1e-2, score_tol=1e-4)
            assert len(b.boxes) and problem is None, f"{onnx.name} vs .pt, {path}: {problem}"
        backend = AutoBackend(str(onnx), device=torch.device("cpu"))
        raw = backend(batch)
        theirs = reference_nms.non_max_suppression(
            raw[0] if isinstance(raw, list | tuple) else raw, 0.25, 0.7
        )
        for path, mine, got in zip(sources, ours, theirs):
            problem = _same_detections(got.numpy(), mine.numpy(), box_tol=1e-2, score_tol=1e-4)
            assert len(mine) and problem is None, f"oracle on {onnx.name} vs ours in torch, {path}: {problem}"


def test_oracle_map_on_our_onnx_equals_its_pt(interop: SimpleNamespace) -> None:
    square_pt = _oracle_val(interop.pt, interop.data, rect=False)
    square_onnx = _oracle_val(interop.fixed, interop.data)  # fixed shape: the oracle letterboxes to 160 x 160
    rect_pt = _oracle_val(interop.pt, interop.data_rect)  # its default: rectangular batches
    rect_onnx = _oracle_val(interop.dynamic, interop.data_rect)
    print(f"oracle mAP50-95 square: .pt {square_pt:.5f} ONNX {square_onnx:.5f}; rect: .pt {rect_pt:.5f} "
          f"ONNX {rect_onnx:.5f}")  # fmt: skip
    assert 0.3 < square_pt < 0.95 and 0.1 < rect_pt < 0.95, "the labels no longer make a discriminating test"
    assert abs(square_onnx - square_pt) <= 0.005
    assert abs(rect_onnx - rect_pt) <= 0.005


def test_our_validate_scores_onnx_like_the_checkpoint(interop: SimpleNamespace) -> None:
    from yolo11_lightning.export.check import compare

    fixed = compare(interop.model, interop.fixed, str(interop.data), (SIZE, SIZE), dynamic=False, batch_size=4,
                    num_workers=0, accelerator="cpu")  # fmt: skip
    print(f"ours, square: {fixed.table()}")
    assert 0.3 < fixed.checkpoint["mAP50-95"] < 0.95
    assert abs(fixed.difference("mAP50-95")) <= 1e-3 and abs(fixed.difference("mAP50")) <= 1e-3
    # A fixed-shape file fed another shape says what to do instead of scoring a different preprocessing.
    from yolo11_lightning.model_files.onnx_runtime import OnnxDetector

    with pytest.raises(ValueError, match=r"fixed\.onnx: exported with a fixed 160x160 input, got a 96x160 batch.*"
                                         r"--data\.rect_val false --data\.image_size 160.*--dynamic"):  # fmt: skip
        OnnxDetector(interop.fixed)(torch.zeros(1, 3, 96, 160))


def test_export_check_data_prints_both_numbers(
    interop: SimpleNamespace, capsys: pytest.CaptureFixture
) -> None:
    from yolo11_lightning.cli.main import main

    out = interop.root / "checked.onnx"
    args = ["export", "--ckpt_path", str(interop.pt), "--out", str(out), "--image-size", str(SIZE), "--dynamic",
            "--check-data", str(interop.data), "--batch-size", "4", "--num-workers", "0", "--accelerator", "cpu"]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in printed.splitlines() if line.split()[:1] in
            (["checkpoint"], ["onnx"], ["difference"])}  # fmt: skip
    assert set(rows) == {"checkpoint", "onnx", "difference"}, printed
    assert (
        abs(float(rows["onnx"][0]) - float(rows["checkpoint"][0])) <= 1e-3
        # A dynamic file is checked in the data module's default rectangular batches; the fixture's labels
        # were made from square-letterbox detections, so the mAP is low there but not zero (square: 0.38).
        and float(rows["checkpoint"][0]) > 0.0
    )
    assert "at 192x128: max |diff|" in printed  # the parity check ran at a second shape too


def test_validate_command_takes_an_onnx_file(interop: SimpleNamespace) -> None:
    from yolo11_lightning.cli.lightning_cli import run_lightning_cli
    from yolo11_lightning.export.check import _square_batches

    square = [f"--data.{k}={str(v).lower()}" for k, v in _square_batches().items()]
    cli = run_lightning_cli([
        "validate", "--model.weights", str(interop.fixed), "--data.dataset", str(interop.data),
        "--data.image_size", str(SIZE), "--data.batch_size", "4", "--data.num_workers", "0", *square,
        "--trainer.accelerator", "cpu", "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
        "--model.log_images", "0", f"--trainer.default_root_dir={interop.root / 'cli'}",
    ])  # fmt: skip
    onnx_map = float(cli.trainer.callback_metrics["val/mAP50-95"])
    assert type(cli.model.model).__name__ == "OnnxDetector" and onnx_map > 0.2
    with pytest.raises(ValueError, match=r"fixed\.onnx: an ONNX file runs validate, test and predict only"):
        run_lightning_cli([
            "fit", "--model.weights", str(interop.fixed), "--data.dataset", str(interop.data),
            "--data.image_size", str(SIZE), "--data.num_workers", "0", "--trainer.accelerator", "cpu",
            "--trainer.logger", "false", f"--trainer.default_root_dir={interop.root / 'fit'}",
        ])  # fmt: skip


def test_dynamic_file_takes_any_multiple_of_32(interop: SimpleNamespace, tmp_path: Path) -> None:
    import ast

    import onnx

    from yolo11_lightning.model_files.onnx_runtime import OnnxDetector

    runner = OnnxDetector(interop.dynamic, num_classes=len(NAMES))
    assert (runner.input_shape, runner.names) == (None, list(NAMES.values()))
    for shape in ((1, 3, 64, 64), (3, 3, 128, 64), (1, 3, 32, 192)):  # the anchor grid follows each shape
        images = torch.rand(*shape, generator=torch.Generator().manual_seed(shape[2]))
        with torch.no_grad():
            expected = interop.model(images)
        assert float((runner(images) - expected).abs().max()) <= onnx_tolerance(interop.model, images)
    proto = onnx.load(str(interop.dynamic))
    dims = [[d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim] for v in (*proto.graph.input,
                                                                                        *proto.graph.output)]  # fmt: skip
    assert dims == [["batch", 3, "height", "width"], ["batch", 7, "anchors"]]
    meta = {p.key: p.value for p in proto.metadata_props}
    assert ast.literal_eval(meta["args"])["dynamic"] is True
    with pytest.raises(
        ValueError, match=r"dynamic\.onnx: input height and width must be multiples of 32, got 64x70"
    ):
        runner(torch.zeros(1, 3, 64, 70))
    with pytest.raises(ValueError, match=r"dynamic\.onnx: the model predicts 3 classes, the dataset has 5"):
        OnnxDetector(interop.dynamic, num_classes=5)
    with pytest.raises(FileNotFoundError, match=r"missing\.onnx"):
        OnnxDetector(tmp_path / "missing.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"not a graph")
    with pytest.raises(ValueError, match=r"junk\.onnx: not a readable ONNX model"):
        OnnxDetector(tmp_path / "junk.onnx")


def test_predict_command_runs_an_onnx_file(interop: SimpleNamespace, tmp_path: Path) -> None:
    import json

    from yolo11_lightning.predict.command import predict

    runs = {}
    for name, model in (("torch", interop.model), ("onnx", interop.fixed)):
        predict(model, interop.root / "predict", tmp_path / name, image_size=SIZE, save_media=False,
                progress_bar=False)  # fmt: skip
        rows = json.loads((tmp_path / name / "predictions.json").read_text())
        by_file: dict[str, list] = {}
        for r in rows:
            x, y, w, h = r["bbox"]
            by_file.setdefault(r["file_name"], []).append([x, y, x + w, y + h, r["score"], r["category_id"]])
        runs[name] = {k: np.array(v) for k, v in by_file.items()}
    assert runs["torch"].keys() == runs["onnx"].keys() and len(runs["torch"]) == len(SHAPES)
    for file_name, expected in runs["torch"].items():
        problem = _same_detections(runs["onnx"][file_name], expected, box_tol=1e-2, score_tol=1e-4)
        assert problem is None, f"{file_name}: {problem}"


@pytest.fixture(scope="module")
def deployed(interop: SimpleNamespace) -> dict[str, Path]:
    """The fixture's model in the other formats at 160 px (INT8 calibrated on the dataset's 8 training images)."""
    pytest.importorskip("openvino")
    from yolo11_lightning.export.calibration import calibration_images
    from yolo11_lightning.export.formats import FORMATS, export_file, output_path

    calibration = calibration_images(str(interop.data), "detect", SIZE, 8)
    return {
        name: export_file(
            fmt,
            interop.model,
            output_path(fmt, interop.root / "model.pt"),
            (SIZE, SIZE),
            calibration=calibration,
        )
        for name, fmt in FORMATS.items()
        if name in ("torchscript", "openvino", "onnx-int8", "openvino-int8")
    }


def test_oracle_runs_our_torchscript_and_openvino_as_our_onnx(
    interop: SimpleNamespace, deployed: dict[str, Path]
) -> None:
    """The reference's loader reads our TorchScript file and OpenVINO folder (their metadata: task, names, size)
    and predicts the detections it predicts from our ONNX file, within the ONNX test's tolerances."""
    from ultralytics import YOLO

    sources = [str(p) for p in interop.images]
    theirs_onnx = YOLO(str(interop.fixed), task="detect").predict(
        sources, imgsz=SIZE, conf=0.25, verbose=False
    )
    for name in ("torchscript", "openvino"):
        loaded = YOLO(str(deployed[name]), task="detect")
        theirs = loaded.predict(sources, imgsz=SIZE, conf=0.25, verbose=False)
        assert theirs[0].names == NAMES
        for path, a, b in zip(sources, theirs, theirs_onnx):
            problem = _same_detections(_rows(a.boxes), _rows(b.boxes), box_tol=1e-2, score_tol=1e-4)
            assert len(b.boxes) and problem is None, f"{name} vs onnx, {path}: {problem}"


def test_our_validate_scores_each_format_like_the_checkpoint(
    interop: SimpleNamespace, deployed: dict[str, Path]
) -> None:
    """fp32 files score the checkpoint's mAP within 0.001 on a model whose validation labels make mAP move with
    any box or score change; INT8 files run through the same validator (their gaps on trained models:
    benchmarks/deploy)."""
    from yolo11_lightning.export.check import compare

    reference = None
    for name, path in deployed.items():
        check = compare(interop.model, path, str(interop.data), (SIZE, SIZE), dynamic=False, batch_size=4,
                        num_workers=0, accelerator="cpu", label=name, checkpoint=reference)  # fmt: skip
        reference = check.checkpoint
        print(f"{name}:\n{check.table()}")
        assert 0.3 < check.checkpoint["mAP50-95"] < 0.95
        if (
            "int8" in name
        ):  # this random net's own detections as labels: far harder than a trained model's gap
            assert check.exported["mAP50-95"] > 0.05, name
        else:
            assert abs(check.difference("mAP50-95")) <= 1e-3, name


def test_int8_keeps_only_the_heads_last_convolutions_in_float(deployed: dict[str, Path]) -> None:
    """Both INT8 files run every convolution on 8-bit weights except the head's last one per branch and level
    (box distributions ``cv2``, class logits ``cv3``), whose outputs the decode reads in float."""
    import onnx
    import openvino as ov

    last = {f"/cv{branch}.{level}.2/Conv" for branch in (2, 3) for level in range(3)}
    graph = onnx.load(str(deployed["onnx-int8"])).graph
    dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    float_convs = {n.name for n in graph.node if n.op_type == "Conv" and n.input[1] not in dequantized}
    assert float_convs == last
    xml = next(deployed["openvino-int8"].glob("*.xml"))
    float_convs = {
        op.get_friendly_name().removesuffix("/WithoutBiases")
        for op in ov.Core().read_model(str(xml)).get_ops()
        if op.get_type_name() == "Convolution" and op.input_value(1).get_node().get_type_name() == "Constant"
    }  # a quantized weight reaches its convolution through a dequantizing Multiply
    assert float_convs == last


def test_predict_runs_each_format_with_the_checkpoints_output(
    interop: SimpleNamespace, deployed: dict[str, Path], tmp_path: Path
) -> None:
    import json

    from yolo11_lightning.predict.command import predict

    runs = {}
    for name, model in (("torch", interop.model), ("torchscript", deployed["torchscript"]),
                        ("openvino", deployed["openvino"])):  # fmt: skip
        predict(model, interop.root / "predict", tmp_path / name, image_size=SIZE, save_media=False,
                progress_bar=False)  # fmt: skip
        rows = json.loads((tmp_path / name / "predictions.json").read_text())
        runs[name] = {
            f: np.array([[*r["bbox"], r["score"], r["category_id"]] for r in rows if r["file_name"] == f])
            for f in {r["file_name"] for r in rows}
        }
    for name in ("torchscript", "openvino"):
        assert runs[name].keys() == runs["torch"].keys() and len(runs["torch"]) == len(SHAPES)
        for file_name, expected in runs["torch"].items():
            problem = _same_detections(runs[name][file_name], expected, box_tol=1e-2, score_tol=1e-4)
            assert problem is None, f"{name} {file_name}: {problem}"
