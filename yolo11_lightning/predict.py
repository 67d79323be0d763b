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
import json
import os
import sys
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from torch.utils.data import DataLoader

from yolo11_lightning.nn import YOLO11
from yolo11_lightning.nn.weights import load_model
from yolo11_lightning.onnx_runner import OnnxDetector, is_onnx_file
from yolo11_lightning.ops.masks import encode_rle
from yolo11_lightning.predict_data import (
    VIDEO_EXTENSIONS,
    PredictionSource,
    SkippedSourceWarning,
    Source,
    collate_prediction,
    list_sources,
)
from yolo11_lightning.training.module import YOLO11Module
from yolo11_lightning.visualize import draw_boxes, draw_masks, save_rgb

RESULTS_JSON = "predictions.json"
RESULTS_JSONL = "predictions.jsonl"
# Ids per video: frame f of the j-th video gets (first video id) + j * FRAMES_PER_VIDEO + f.
FRAMES_PER_VIDEO = 10_000_000
# Extensions OpenCV writes everywhere; other inputs (e.g. .mpo, .pbm) get an annotated .jpg.
_WRITABLE = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"})


def annotated_name(path: str | Path, kind: str | None = None) -> str:
    """File name of the annotated copy of one input (videos become ``<stem>.mp4``), before collisions."""
    path = Path(path)
    if kind == "video" or (kind is None and path.suffix.lower().lstrip(".") in VIDEO_EXTENSIONS):
        return f"{path.stem}.mp4"
    return path.name if path.suffix.lower() in _WRITABLE else f"{path.stem}.jpg"


def output_names(sources: Sequence[Source]) -> dict[str, str]:
    """Input path -> output file name, distinct for every input.

    An input keeps ``annotated_name`` unless another input would get the same name; then each of them is
    named ``<stem>_<ext><suffix>`` (``a.gif``, ``a.mp4`` -> ``a_gif.mp4``, ``a_mp4.mp4``), with ``_<n>``
    added in the unlikely case that this too is taken.
    """
    natural = {str(s.path): annotated_name(s.path, s.kind) for s in sources}
    counts = Counter(natural.values())
    names: dict[str, str] = {}
    taken = {name for name, n in counts.items() if n == 1}
    for s in sources:
        key, name = str(s.path), natural[str(s.path)]
        if counts[name] > 1:
            suffix = Path(name).suffix
            base = f"{s.path.stem}_{s.path.suffix.lstrip('.').lower()}"
            name, n = f"{base}{suffix}", 1
            while name in taken:
                name, n = f"{base}_{n}{suffix}", n + 1
            taken.add(name)
        names[key] = name
    return names


class ImageIds:
    """COCO ``image_id``s, unique per file and frame, fixed before the run (no worker-order dependence).

    * an image whose name is a number no other image shares keeps it (``000000000139.jpg`` -> 139, so COCO
      val results evaluate directly);
    * the other images get the ids after the largest such number, in name order;
    * then each video a block of ``FRAMES_PER_VIDEO`` ids, frame f = block start + f.
    """

    def __init__(self, sources: Sequence[Source]) -> None:
        numbers = Counter(int(s.path.stem) for s in sources if s.kind == "image" and s.path.stem.isdigit())
        self._ids: dict[str, int] = {}
        for s in sources:
            if s.kind == "image" and s.path.stem.isdigit() and numbers[int(s.path.stem)] == 1:
                self._ids[str(s.path)] = int(s.path.stem)
        next_id = max(self._ids.values(), default=0) + 1
        for s in sources:
            if s.kind == "image" and str(s.path) not in self._ids:
                self._ids[str(s.path)], next_id = next_id, next_id + 1
        for s in sources:
            if s.kind == "video":
                self._ids[str(s.path)], next_id = next_id, next_id + FRAMES_PER_VIDEO

    def __call__(self, path: str, frame: int = -1) -> int:
        if path not in self._ids:
            raise KeyError(f"{path} is not one of the inputs the ids were assigned for")
        if frame >= FRAMES_PER_VIDEO:
            raise ValueError(f"{path}: more than {FRAMES_PER_VIDEO} frames, image_ids would overlap")
        return self._ids[path] + max(frame, 0)


class PredictionWriter(BasePredictionWriter):
    """Writes annotated images/videos and the results (json lines as they come, COCO json at the end).

    ``results`` holds every row, ``failures`` maps each input that failed (unreadable, truncated, or whose
    annotated copy could not be written) to the reason, ``seen_paths`` the inputs that gave predictions.

    Args:
        out_dir: output folder (created).
        names: class names, index = class id (None: the ids are drawn).
        save_media: write annotated images and videos (the json is always written).
        sources: every input of the run: output names and image ids are fixed from them up front
            (``output_names``, ``ImageIds``).
    """

    def __init__(
        self,
        out_dir: str | Path,
        names: Sequence[str] | None = None,
        save_media: bool = True,
        sources: Sequence[Source] = (),
    ) -> None:
        super().__init__(write_interval="batch")
        self.out_dir = Path(out_dir)
        self.names = list(names) if names is not None else None
        self.save_media = save_media
        self.results: list[dict[str, Any]] = []
        self.failures: dict[str, str] = {}
        self.seen_paths: set[str] = set()
        self.num_images = 0
        self.num_frames = 0
        self._names = output_names(sources)
        self._ids = ImageIds(sources)
        self._videos: dict[str, cv2.VideoWriter] = {}
        self._unwritable: set[str] = set()
        self._jsonl: Any = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.out_dir / RESULTS_JSONL, "w")  # noqa: SIM115 -- closed at the end

    def output_name(self, path: str) -> str:
        return self._names.get(path) or annotated_name(path)

    def image_id(self, path: str, frame: int) -> int:
        return self._ids(path, frame)

    def fail(self, path: str, reason: str) -> None:
        """Record that input ``path`` failed (the first reason is kept)."""
        self.failures.setdefault(path, reason)

    def _draw(self, original: np.ndarray, det: np.ndarray, masks: np.ndarray | None = None) -> np.ndarray:
        thickness = max(1, round(sum(original.shape[:2]) / 600))
        if masks is not None and len(masks):
            original = draw_masks(original, masks, det[:, 5])
        return draw_boxes(original, det[:, :4], det[:, 5], det[:, 4], self.names, thickness=thickness)

    def _write_video_frame(self, path: str, fps: float, frame: np.ndarray) -> None:
        writer = self._videos.get(path)
        if writer is None:
            target = self.out_dir / self.output_name(path)
            height, width = frame.shape[:2]
            writer = cv2.VideoWriter(str(target), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
            if not writer.isOpened():
                raise OSError(f"{target}: OpenCV cannot write mp4v video here")
            self._videos[path] = writer
        writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))

    def _save(self, path: str, frame: int, fps: float, drawn: np.ndarray) -> None:
        """Write one annotated image or video frame; a failure is reported once per input, never raised."""
        if path in self._unwritable:
            return
        try:
            if frame < 0:
                save_rgb(str(self.out_dir / self.output_name(path)), drawn)
            else:
                self._write_video_frame(path, fps, drawn)
        except (OSError, cv2.error) as e:
            reason = f"cannot write the annotated copy ({e})"
            warnings.warn(f"{path}: {reason}; its predictions are still in the json", SkippedSourceWarning,
                          stacklevel=2)  # fmt: skip
            self.fail(path, reason)
            self._unwritable.add(path)

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,
                           dataloader_idx=0) -> None:  # fmt: skip
        for path, reason in batch.get("problems", []):
            self.fail(path, reason)
        lines = []
        for i, det in enumerate(prediction):
            masks = None
            if isinstance(det, dict):  # segmentation: {"detections": (n, 6), "masks": (n, h0, w0) bool}
                det, masks = det["detections"], det["masks"].detach().cpu().numpy()
            det = det.detach().float().cpu().numpy()
            path, frame = batch["paths"][i], batch["frames"][i]
            image_id = self.image_id(path, frame)
            self.seen_paths.add(path)
            if frame < 0:
                self.num_images += 1
            else:
                self.num_frames += 1
            for k, (x1, y1, x2, y2, score, cls) in enumerate(det.tolist()):
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
                if masks is not None:
                    row["segmentation"] = encode_rle(masks[k])
                self.results.append(row)
                lines.append(json.dumps(row))
            original = batch["originals"][i]
            if self.save_media and original is not None:
                self._save(path, frame, batch["fps"][i], self._draw(original, det, masks))
        if self._jsonl is not None and lines:
            self._jsonl.write("\n".join(lines) + "\n")
            self._jsonl.flush()

    def _close(self) -> None:
        for writer in self._videos.values():
            writer.release()
        self._videos.clear()
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close()
        target = self.out_dir / RESULTS_JSON
        temporary = target.with_name(f".{RESULTS_JSON}.tmp-{os.getpid()}")
        temporary.write_text(json.dumps(self.results))
        os.replace(temporary, target)  # a reader never sees half a file

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._close()  # predictions.jsonl keeps every row written so far


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
    """A ``YOLO11Module`` around a detector or segmenter, or any model file (``nn.weights.load_model``; an
    ``.onnx`` file runs through ``onnx_runner.OnnxDetector``), with the given post-processing; the module's
    task is the model's."""
    if isinstance(model, YOLO11):  # the caller's model (e.g. in a notebook): used in its own memory layout
        nhwc = model.layers[0].conv.weight.is_contiguous(memory_format=torch.channels_last)
    elif is_onnx_file(model):  # an exported file, run by onnxruntime
        model, nhwc = OnnxDetector(model, task=None), False
    else:
        model, nhwc = load_model(model, task=None).to(memory_format=torch.channels_last), True
    module = YOLO11Module(
        scale=model.scale, num_classes=model.num_classes, class_names=model.names,
        conf_threshold=conf, iou_threshold=iou, max_detections=max_det, ema=False, log_images=0,
        channels_last=nhwc, task=getattr(model, "task", "detect"),
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
    names = output_names(sources)
    if save_media:
        out = Path(out_dir).resolve()
        clash = [s.path for s in sources if (out / names[str(s.path)]).resolve() == s.path.resolve()]
        if clash:
            raise ValueError(f"--out {out_dir}: the annotated copy would overwrite the input {clash[0]}")
    dataset = PredictionSource(sources, image_size, keep_originals=save_media)
    module = build_module(model, conf, iou, max_det)
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
    """Entry point of ``yolo11-lightning predict --source ...``; returns the exit code (0, 2: some input
    failed, 1: nothing read or an error)."""
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
