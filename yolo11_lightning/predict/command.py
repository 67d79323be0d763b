"""``yolo11-lightning predict --source PATH``: detections (or instance masks) on images, folders and videos.

    yolo11-lightning predict --ckpt_path best.ckpt --source photos/ --out runs/predict --conf 0.25

Runs ``lightning.Trainer.predict`` (progress bar, accelerator choice) with ``YOLO11Module.predict_step`` over
``PredictionSource`` batches; ``PredictionWriter`` (a ``BasePredictionWriter``) writes, under ``--out``:

* each image annotated, under its own file name; each video annotated as ``<stem>.mp4``. Inputs whose
  names would give the same output (``a.gif`` and ``a.mp4``, ``a.jpg`` and ``a.ppm``) are written as
  ``<stem>_<ext>`` instead (``a_gif.mp4``, ``a_mp4.mp4``), so nothing is overwritten;
* ``predictions.jsonl``: the results as they come, one json object per line, flushed after every batch, so a
  run that dies keeps what it had;
* ``predictions.json``: the same rows as COCO results, written at the end (atomically), one
  ``{"image_id", "category_id", "bbox": [x, y, w, h], "score"}`` per detection in original pixels, plus
  ``file_name`` (and ``frame`` for videos) and ``category_name``. ``category_id`` is the 0-based class
  index; ``image_id`` is unique per file and frame (``ImageIds``). A segmentation model's rows also hold
  ``segmentation``, the instance mask in original pixels as COCO compressed RLE (``{"size": [h, w], "counts"}``),
  and its annotated copies show the masks under the boxes.

Unreadable files in a folder, and videos that end before their frame count, are reported with a warning
and in the summary, and the command then exits with 2 (1: nothing could be read, or a missing or unusable
``--source`` or model file). Without ``--source``, ``predict`` is LightningCLI's (the dataset's test/val
split).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from yolo11_lightning.data.images.limits import DEFAULT_MAX_IMAGE_PIXELS
from yolo11_lightning.model_files.exported_files import is_exported_file, open_exported
from yolo11_lightning.model_files.exported_model import ExportedModel
from yolo11_lightning.model_files.image_size import choose_image_size, file_image_size
from yolo11_lightning.model_files.weights import load_model
from yolo11_lightning.nn.yolo11 import YOLO11
from yolo11_lightning.predict.sources import PredictionSource, Source, collate_prediction, list_sources
from yolo11_lightning.predict.writer import RESULTS_JSON, RESULTS_JSONL, PredictionWriter, output_names
from yolo11_lightning.training.module import YOLO11Module


def _trainer_device(device: str) -> tuple[str, Any]:
    """``--device`` -> (accelerator, devices) for one device: auto, cpu, gpu/cuda, cuda:N, mps."""
    device = device.lower()
    if device in ("auto", "cpu", "mps"):
        return device, 1
    if device in ("gpu", "cuda"):
        return "gpu", 1
    if device.startswith("cuda:") and device[5:].isdigit():
        return "gpu", [int(device[5:])]
    raise ValueError(f"--device {device!r}: use auto, cpu, gpu, cuda, cuda:N or mps")


def build_module(model: str | Path | YOLO11, conf: float, iou: float, max_det: int) -> YOLO11Module:
    """A ``YOLO11Module`` around a detector or segmenter, or any model file (``model_files.weights.load_model``; an
    exported file runs through its runtime, ``model_files.exported_files``), with the given post-processing; the module's
    task is the model's."""
    if isinstance(model, YOLO11):  # the caller's model (e.g. in a notebook): used in its own memory layout
        nhwc = model.layers[0].conv.weight.is_contiguous(memory_format=torch.channels_last)
    elif is_exported_file(model):  # an exported file, run by its runtime
        model, nhwc = open_exported(model, task=None), False
    else:
        model, nhwc = load_model(model, task=None).to(memory_format=torch.channels_last), True
    module = YOLO11Module(
        scale=model.scale, num_classes=model.num_classes, class_names=model.names,
        conf_threshold=conf, iou_threshold=iou, max_detections=max_det, ema=False, log_images=0,
        channels_last=nhwc, task=getattr(model, "task", "detect"),
    )  # fmt: skip
    module.model = model
    return module.eval()


def _recorded_size(model: str | Path | YOLO11, loaded: Any) -> int | None:
    """The side ``model`` was trained (an ONNX file: exported) at, as its file says; None when unknown."""
    if isinstance(loaded, ExportedModel):
        return max(loaded.info.size) if loaded.info.size is not None else None
    return None if isinstance(model, YOLO11) else file_image_size(model)


def predict(
    model: str | Path | YOLO11,
    source: str | Path,
    out_dir: str | Path,
    conf: float = 0.25,
    iou: float = 0.7,
    max_det: int = 300,
    image_size: int | None = None,
    device: str = "auto",
    batch_size: int = 1,
    num_workers: int = 0,
    save_media: bool = True,
    progress_bar: bool = True,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
) -> PredictionWriter:
    """Predict on ``source`` and write the outputs under ``out_dir``; returns the writer (results, counts).

    ``model`` is a ``YOLO11`` (e.g. ``module.model`` in a notebook) or a model file: Lightning ``.ckpt``,
    weights file, reference ``.pt``. Raises FileNotFoundError / ValueError naming a missing or unusable source or model file.
    An image above ``max_image_pixels`` (None or 0: no limit) is skipped from its header, undecoded, like an
    unreadable one. ``image_size`` None: the size the model was trained at (``model_files.image_size``; an ONNX
    file's export size), else 640; a line says which size runs.
    """
    if not 0.0 <= conf <= 1.0 or not 0.0 <= iou <= 1.0:
        raise ValueError(f"--conf and --iou must lie in [0, 1], got {conf} and {iou}")
    if max_det < 1 or batch_size < 1 or num_workers < 0:
        raise ValueError("--max-det and --batch-size must be >= 1, --num-workers >= 0")
    sources: list[Source] = list_sources(source)
    names = output_names(sources)
    if save_media:
        out = Path(out_dir).resolve()
        clash = [s.path for s in sources if (out / names[str(s.path)]).resolve() == s.path.resolve()]
        if clash:
            raise ValueError(f"--out {out_dir}: the annotated copy would overwrite the input {clash[0]}")
    module = build_module(model, conf, iou, max_det)
    image_size, said = choose_image_size(image_size, _recorded_size(model, module.model))
    print(said)
    task = module.task  # a classifier reads its own input transform, not the letterbox
    dataset = PredictionSource(
        sources, image_size, keep_originals=save_media, max_image_pixels=max_image_pixels,
        image_transform=task.image_transform(False, image_size, {}) if task.whole_image else None,
    )  # fmt: skip
    writer = PredictionWriter(out_dir, module.model.names, save_media, sources)
    accelerator, devices = _trainer_device(device)
    loader = DataLoader(
        dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate_prediction
    )
    trainer = L.Trainer(
        accelerator=accelerator, devices=devices, logger=False, callbacks=[writer],
        enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=progress_bar,
    )  # fmt: skip
    with warnings.catch_warnings():
        # Expected with an IterableDataset (no length, no sampler indices) and with num_workers=0 on CPU.
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*IterableDataset.*")
        warnings.filterwarnings("ignore", message=".*infer the batch indices.*")
        trainer.predict(module, dataloaders=loader, return_predictions=False)
    return writer


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="yolo11-lightning predict",
        description="Detect objects in an image, a folder of images/videos or a video file; writes annotated "
        "copies and a COCO results json.",
        epilog="Exit status: 0 all inputs done, 2 some input failed (unreadable, truncated video, output not "
        "written; the rest is written), 1 nothing could be read or a usage error. Without --source, "
        "`yolo11-lightning predict --config ...` is LightningCLI's predict over the dataset's test (else val) "
        "split; see `yolo11-lightning predict --config CONFIG --help`.",
    )
    p.add_argument("--ckpt_path", "--ckpt-path", "--weights", "--model", dest="ckpt_path", required=True,
                   help="Lightning .ckpt (its EMA weights), weights file from `export`, reference .pt, or an "
                   "exported model (.onnx, .torchscript, an _openvino_model folder, .pte)")  # fmt: skip
    p.add_argument("--source", required=True, help="image, video, or folder of them (not recursive)")
    p.add_argument("--out", default="runs/predict", help="output folder (default runs/predict)")
    p.add_argument("--conf", type=float, default=0.25, help="minimum class score (default 0.25)")
    p.add_argument("--iou", type=float, default=0.7, help="NMS IoU threshold (default 0.7)")
    p.add_argument("--max-det", "--max_det", dest="max_det", type=int, default=300,
                   help="detections kept per image (default 300)")  # fmt: skip
    p.add_argument("--image-size", "--image_size", dest="image_size", type=int, default=None,
                   help="network input side, a multiple of 32 (default: the size the model was trained at, "
                   "as its file records it, else 640)")  # fmt: skip
    p.add_argument("--device", default="auto", help="auto (default), cpu, gpu, cuda:N or mps")
    p.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=1)
    p.add_argument("--num-workers", "--num_workers", dest="num_workers", type=int, default=0,
                   help="DataLoader processes decoding the inputs (default 0: in the main process)")  # fmt: skip
    p.add_argument("--no-save", action="store_true", help="only write predictions.json")
    p.add_argument("--max-image-pixels", "--max_image_pixels", dest="max_image_pixels", type=int,
                   default=DEFAULT_MAX_IMAGE_PIXELS,
                   help="skip images of more pixels, refused from their headers before decoding (default "
                   f"{DEFAULT_MAX_IMAGE_PIXELS}, the reference's limit; 0: no limit)")  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``yolo11-lightning predict --source ...``; returns the exit code (0, 2: some input
    failed, 1: nothing read or an error)."""
    args = _parser().parse_args(argv)
    try:
        writer = predict(
            args.ckpt_path, args.source, args.out, conf=args.conf, iou=args.iou, max_det=args.max_det,
            image_size=args.image_size, device=args.device, batch_size=args.batch_size,
            num_workers=args.num_workers, save_media=not args.no_save, max_image_pixels=args.max_image_pixels,
        )  # fmt: skip
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    listed = list_sources(args.source)
    for s in listed:  # files that gave nothing at all, whatever the reason
        if str(s.path) not in writer.seen_paths:
            writer.fail(str(s.path), "unreadable")
    print(
        f"{writer.num_images} images, {writer.num_frames} video frames, {len(writer.results)} detections -> "
        f"{Path(args.out) / RESULTS_JSON} (and {RESULTS_JSONL})"
    )
    if writer.failures:
        print(f"{len(writer.failures)} of {len(listed)} input(s) failed:", file=sys.stderr)
        for path, reason in writer.failures.items():
            print(f"  {path}: {reason}", file=sys.stderr)
    if not writer.seen_paths:
        print(f"error: {args.source}: no input could be read", file=sys.stderr)
        return 1
    return 2 if writer.failures else 0
