"""What ``yolo11-lightning predict --source`` writes: annotated copies, ``predictions.jsonl`` and COCO results.

``PredictionWriter`` (a ``BasePredictionWriter``) turns each predicted batch into annotated images or video
frames and result rows (see ``predict`` for the files and their formats); ``ImageIds`` numbers files and
frames for COCO ``image_id``; ``output_names`` keeps two inputs from writing the same output file.
"""

from __future__ import annotations

import json
import os
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import lightning as L
import numpy as np
from lightning.pytorch.callbacks import BasePredictionWriter

from yolo11_lightning.plots.drawing import save_rgb
from yolo11_lightning.predict.sources import VIDEO_EXTENSIONS, SkippedSourceWarning, Source

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
        self.task = pl_module.task  # what a prediction holds beyond its boxes: ``Task.split_result``
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.out_dir / RESULTS_JSONL, "w")  # noqa: SIM115 -- closed at the end

    def output_name(self, path: str) -> str:
        return self._names.get(path) or annotated_name(path)

    def image_id(self, path: str, frame: int) -> int:
        return self._ids(path, frame)

    def fail(self, path: str, reason: str) -> None:
        """Record that input ``path`` failed (the first reason is kept)."""
        self.failures.setdefault(path, reason)

    def _draw(self, original: np.ndarray, det: np.ndarray, extras: dict[str, Any]) -> np.ndarray:
        thickness = max(1, round(sum(original.shape[:2]) / 600))
        return self.task.draw_prediction(original, det, extras, self.names, thickness)

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
        for i, result in enumerate(prediction):
            det, extras = self.task.split_result(result)  # (n, 6), per-detection extras (a segmenter's masks)
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
                row.update(self.task.result_fields(extras, k))
                self.results.append(row)
                lines.append(json.dumps(row))
            fields = self.task.image_fields(extras)  # a classifier's answer: one row per image
            if fields:
                row = {"image_id": image_id, "file_name": Path(path).name, **fields}
                if frame >= 0:
                    row["frame"] = frame
                self.results.append(row)
                lines.append(json.dumps(row))
            original = batch["originals"][i]
            if self.save_media and original is not None:
                self._save(path, frame, batch["fps"][i], self._draw(original, det, extras))
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
