"""``yolo11-lightning predict --source PATH``: detections on images, folders and videos.

    yolo11-lightning predict --ckpt_path best.ckpt --source photos/ --out runs/predict --conf 0.25

Runs ``lightning.Trainer.predict`` (progress bar, accelerator choice) with ``YOLO11Module.predict_step`` over
``PredictionSource`` batches; ``PredictionWriter`` (a ``BasePredictionWriter``) writes, under ``--out``:

* each image annotated, under its own file name; each video annotated as ``<stem>.mp4``;
* ``predictions.json``: COCO results, one ``{"image_id", "category_id", "bbox": [x, y, w, h], "score"}`` per
  detection in original pixels, plus ``file_name`` (and ``frame`` for videos) and ``category_name``.
  ``image_id`` is the file name's number when it is one (``000000000139.jpg`` -> 139, as in COCO), else the
  running index of the image or frame; ``category_id`` is the 0-based class index.

Unreadable files in a folder are skipped with a warning; a missing or unusable ``--source`` or model
file is an error naming it. Without ``--source``, ``predict`` is LightningCLI's (the dataset's test/val split).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from torch.utils.data import DataLoader

from yolo11_lightning.export import load_model
from yolo11_lightning.nn import YOLO11
from yolo11_lightning.predict_data import PredictionSource, Source, collate_prediction, list_sources
from yolo11_lightning.training.module import YOLO11Module
from yolo11_lightning.visualize import draw_boxes, save_rgb

RESULTS_JSON = "predictions.json"
# Extensions OpenCV writes everywhere; other inputs (e.g. .mpo, .pbm) get an annotated .jpg.
_WRITABLE = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"})


def annotated_name(path: str | Path) -> str:
    """File name of the annotated copy of an image (videos become ``<stem>.mp4``)."""
    path = Path(path)
    return path.name if path.suffix.lower() in _WRITABLE else f"{path.stem}.jpg"


def _image_id(path: str, running: int) -> int:
    stem = Path(path).stem
    return int(stem) if stem.isdigit() else running


class PredictionWriter(BasePredictionWriter):
    """Writes annotated images/videos and collects COCO results; ``summary`` says what was written.

    Args:
        out_dir: output folder (created).
        names: class names, index = class id (None: the ids are drawn).
        save_media: write annotated images and videos (the json is always written).
    """

    def __init__(self, out_dir: str | Path, names: Sequence[str] | None = None, save_media: bool = True):
        super().__init__(write_interval="batch")
        self.out_dir = Path(out_dir)
        self.names = list(names) if names is not None else None
        self.save_media = save_media
        self.results: list[dict[str, Any]] = []
        self.seen_paths: set[str] = set()
        self.num_images = 0
        self.num_frames = 0
        self._videos: dict[str, cv2.VideoWriter] = {}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def _draw(self, original: np.ndarray, det: np.ndarray) -> np.ndarray:
        thickness = max(1, round(sum(original.shape[:2]) / 600))
        return draw_boxes(original, det[:, :4], det[:, 5], det[:, 4], self.names, thickness=thickness)

    def _write_video_frame(self, path: str, fps: float, frame: np.ndarray) -> None:
        writer = self._videos.get(path)
        if writer is None:
            target = self.out_dir / f"{Path(path).stem}.mp4"
            height, width = frame.shape[:2]
            writer = cv2.VideoWriter(str(target), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
            if not writer.isOpened():
                raise OSError(f"{target}: OpenCV cannot write mp4v video here")
            self._videos[path] = writer
        writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,
                           dataloader_idx=0) -> None:  # fmt: skip
        for i, det in enumerate(prediction):
            det = det.detach().float().cpu().numpy()
            path, frame = batch["paths"][i], batch["frames"][i]
            image_id = _image_id(path, self.num_images + self.num_frames)
            self.seen_paths.add(path)
            if frame < 0:
                self.num_images += 1
            else:
                self.num_frames += 1
            for x1, y1, x2, y2, score, cls in det.tolist():
                row = {
                    "image_id": image_id,
                    "category_id": int(cls),
                    "bbox": [round(x1, 3), round(y1, 3), round(x2 - x1, 3), round(y2 - y1, 3)],
                    "score": round(score, 5),
                    "file_name": Path(path).name,
                }
                if self.names is not None and int(cls) < len(self.names):
                    row["category_name"] = self.names[int(cls)]
                if frame >= 0:
                    row["frame"] = frame
                self.results.append(row)
            original = batch["originals"][i]
            if not self.save_media or original is None:
                continue
            drawn = self._draw(original, det)
            if frame < 0:
                save_rgb(str(self.out_dir / annotated_name(path)), drawn)
            else:
                self._write_video_frame(path, batch["fps"][i], drawn)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for writer in self._videos.values():
            writer.release()
        self._videos.clear()
        (self.out_dir / RESULTS_JSON).write_text(json.dumps(self.results))


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
    """A ``YOLO11Module`` around a detector or any model file (``export.load_model``), with the given
    post-processing."""
    if isinstance(model, YOLO11):  # the caller's model (e.g. in a notebook): used in its own memory layout
        nhwc = model.layers[0].conv.weight.is_contiguous(memory_format=torch.channels_last)
    else:
        model, nhwc = load_model(model).to(memory_format=torch.channels_last), True
    module = YOLO11Module(
        scale=model.scale, num_classes=model.num_classes, class_names=model.names,
        conf_threshold=conf, iou_threshold=iou, max_detections=max_det, ema=False, log_images=0,
        channels_last=nhwc,
    )  # fmt: skip
    module.model = model
    return module.eval()


def predict(
    model: str | Path | YOLO11,
    source: str | Path,
    out_dir: str | Path,
    conf: float = 0.25,
    iou: float = 0.7,
    max_det: int = 300,
    image_size: int = 640,
    device: str = "auto",
    batch_size: int = 1,
    num_workers: int = 0,
    save_media: bool = True,
    progress_bar: bool = True,
) -> PredictionWriter:
    """Predict on ``source`` and write the outputs under ``out_dir``; returns the writer (results, counts).

    ``model`` is a ``YOLO11`` (e.g. ``module.model`` in a notebook) or a model file: Lightning ``.ckpt``,
    weights file, reference ``.pt``. Raises FileNotFoundError / ValueError naming a missing or unusable source or model file.
    """
    if not 0.0 <= conf <= 1.0 or not 0.0 <= iou <= 1.0:
        raise ValueError(f"--conf and --iou must lie in [0, 1], got {conf} and {iou}")
    if max_det < 1 or batch_size < 1 or num_workers < 0:
        raise ValueError("--max-det and --batch-size must be >= 1, --num-workers >= 0")
    sources: list[Source] = list_sources(source)
    if save_media:
        out = Path(out_dir).resolve()
        clash = [s.path for s in sources if (out / annotated_name(s.path)).resolve() == s.path.resolve()]
        if clash:
            raise ValueError(f"--out {out_dir}: the annotated copy would overwrite the input {clash[0]}")
    dataset = PredictionSource(sources, image_size, keep_originals=save_media)
    module = build_module(model, conf, iou, max_det)
    writer = PredictionWriter(out_dir, module.model.names, save_media)
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
        epilog="Without --source, `yolo11-lightning predict --config ...` is LightningCLI's predict over the "
        "dataset's test (else val) split; see `yolo11-lightning predict --config CONFIG --help`.",
    )
    p.add_argument("--ckpt_path", "--ckpt-path", "--weights", dest="ckpt_path", required=True,
                   help="Lightning .ckpt (its EMA weights), weights file from `export`, or reference .pt")  # fmt: skip
    p.add_argument("--source", required=True, help="image, video, or folder of them (not recursive)")
    p.add_argument("--out", default="runs/predict", help="output folder (default runs/predict)")
    p.add_argument("--conf", type=float, default=0.25, help="minimum class score (default 0.25)")
    p.add_argument("--iou", type=float, default=0.7, help="NMS IoU threshold (default 0.7)")
    p.add_argument("--max-det", "--max_det", dest="max_det", type=int, default=300,
                   help="detections kept per image (default 300)")  # fmt: skip
    p.add_argument("--image-size", "--image_size", dest="image_size", type=int, default=640,
                   help="network input side, a multiple of 32 (default 640)")  # fmt: skip
    p.add_argument("--device", default="auto", help="auto (default), cpu, gpu, cuda:N or mps")
    p.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=1)
    p.add_argument("--num-workers", "--num_workers", dest="num_workers", type=int, default=0,
                   help="DataLoader processes decoding the inputs (default 0: in the main process)")  # fmt: skip
    p.add_argument("--no-save", action="store_true", help="only write predictions.json")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``yolo11-lightning predict --source ...``; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        writer = predict(
            args.ckpt_path, args.source, args.out, conf=args.conf, iou=args.iou, max_det=args.max_det,
            image_size=args.image_size, device=args.device, batch_size=args.batch_size,
            num_workers=args.num_workers, save_media=not args.no_save,
        )  # fmt: skip
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    listed = list_sources(args.source)
    skipped = [str(s.path) for s in listed if str(s.path) not in writer.seen_paths]
    print(
        f"{writer.num_images} images, {writer.num_frames} video frames, {len(writer.results)} detections -> "
        f"{Path(args.out) / RESULTS_JSON}"
    )
    if skipped:
        print(f"skipped {len(skipped)} unreadable file(s): {', '.join(skipped)}", file=sys.stderr)
    if not writer.seen_paths:
        print(f"error: {args.source}: no input could be read", file=sys.stderr)
        return 1
    return 0
