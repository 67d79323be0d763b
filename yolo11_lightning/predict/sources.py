"""What ``yolo11-lightning predict`` reads: images and video frames, letterboxed into the batch contract.

A source is an image file, a video file, or a folder of them (not recursive, sorted by name). Frames of a
video are read in order, so the set of sources is an ``IterableDataset``: with DataLoader workers each
worker takes whole files (file i goes to worker i mod W), which keeps every video's frames in order.

An unreadable image or video is skipped with a ``SkippedSourceWarning`` naming the file and the reason (an
image above the pixel limit is one: refused from its header, never decoded; videos are OpenCV's to bound),
and so is the rest of a video that stops before the frame count its header gives (truncated or corrupt:
the frames read are kept). The rest of the run goes on, and the failure travels to the main process in
the batch (``problems``), whatever the number of DataLoader workers. Batches are ``structures.batch.PredictionBatch``:
the ``ImageBatch`` contract (``images`` uint8 (B, 3, S, S), ``scales``, ``pads``, ``orig_sizes``) so
``YOLO11Module.predict_step`` maps boxes back to original pixels, plus what the writer needs: ``paths``,
``frames`` (-1 for an image), ``fps``, the ``originals`` and ``problems`` ((path, reason) pairs).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from yolo11_lightning.data.augment.transforms import letterbox
from yolo11_lightning.data.images.io import IMAGE_EXTENSIONS, read_image
from yolo11_lightning.data.images.limits import DEFAULT_MAX_IMAGE_PIXELS, ImageReadError, pixel_limit
from yolo11_lightning.structures.batch import PredictionBatch, image_tensor, stack_images

VIDEO_EXTENSIONS = frozenset({"mp4", "avi", "mov", "mkv", "m4v", "webm", "mpg", "mpeg", "wmv", "asf", "gif"})


class SkippedSourceWarning(UserWarning):
    """An input file that could not be read and was left out of the predictions."""


@dataclass(frozen=True)
class Source:
    """One input file: ``kind`` is "image" or "video"."""

    path: Path
    kind: str


def _kind(path: Path) -> str | None:
    ext = path.suffix.lower().lstrip(".")
    return "image" if ext in IMAGE_EXTENSIONS else "video" if ext in VIDEO_EXTENSIONS else None


def list_sources(source: str | Path) -> list[Source]:
    """The images and videos named by ``source`` (a file or a folder).

    Raises FileNotFoundError for a missing path, ValueError for a file of unknown type or a folder without
    any image or video.
    """
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"source not found: {path}")
    if path.is_file():
        kind = _kind(path)
        if kind is None:
            known = ", ".join(sorted(IMAGE_EXTENSIONS | VIDEO_EXTENSIONS))
            raise ValueError(f"{path}: not an image or video file (known extensions: {known})")
        return [Source(path, kind)]
    found = [Source(p, k) for p in sorted(path.iterdir()) if p.is_file() and (k := _kind(p)) is not None]
    if not found:
        raise ValueError(f"{path}: folder holds no image or video file")
    return found


def _skip(path: Path, reason: str) -> dict[str, Any]:
    """Warn, and return the placeholder sample that carries the failure to the main process."""
    warnings.warn(f"{path}: skipped ({reason})", SkippedSourceWarning, stacklevel=2)
    return {"problem": (str(path), reason)}


def video_shortfall(frames_read: int, frames_claimed: int) -> str | None:
    """The reason to report a video that stopped early, or None when it is complete.

    Containers without an exact frame index give an estimated count, so a shortfall of up to 1 % (at
    least one frame) is taken as complete.
    """
    missing = frames_claimed - frames_read
    if frames_claimed <= 0 or missing <= max(1, frames_claimed // 100):
        return None
    return (
        f"video ended after {frames_read} of {frames_claimed} frames (truncated or corrupt); "
        "the frames read are kept"
    )


class PredictionSource(IterableDataset):
    """Letterboxed samples from images and video frames.

    Args:
        sources: files from ``list_sources``.
        image_size: side of the square network input (multiple of 32). Images are scaled to fit (up or
            down) and padded with grey 114, as the reference predictor does for a batch.
        keep_originals: carry the decoded original (H, W, 3) RGB image in each sample (for drawing).
        max_image_pixels: an image of more pixels is skipped from its header, undecoded (default the
            reference's limit; None or 0: no limit).
        image_transform: instead of letterboxing, the model's own input transform of an (H, W, 3) RGB image
            (a classifier's, ``Task.image_transform``: shortest side resized, centre crop); ``scale`` and
            ``pad`` are then NaN.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        image_size: int = 640,
        keep_originals: bool = True,
        max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
        image_transform: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        super().__init__()
        self.image_transform = image_transform
        if image_size <= 0 or image_size % 32:
            raise ValueError(f"image_size must be a positive multiple of 32, got {image_size}")
        self.sources = list(sources)
        self.image_size = image_size
        self.keep_originals = keep_originals
        self.max_image_pixels = pixel_limit(max_image_pixels)

    def _sample(self, rgb: np.ndarray, source: Source, frame: int, fps: float) -> dict[str, Any]:
        if self.image_transform is not None:
            image, scale, (left, top) = self.image_transform(rgb), math.nan, (math.nan, math.nan)
        else:
            image, scale, (left, top) = letterbox(rgb, self.image_size, scaleup=True)
        return {
            "image": image_tensor(image),
            "scale": scale,
            "pad": (float(left), float(top)),
            "orig_size": rgb.shape[:2],
            "path": str(source.path),
            "frame": frame,
            "fps": fps,
            "original": rgb if self.keep_originals else None,
        }

    def _frames(self, source: Source) -> Iterator[dict[str, Any]]:
        capture = cv2.VideoCapture(str(source.path))
        try:
            if not capture.isOpened():
                yield _skip(source.path, "cannot open the video (0 frames read)")
                return
            fps = float(capture.get(cv2.CAP_PROP_FPS) or 0.0) or 30.0
            claimed = int(capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
            frame = 0
            ok, bgr = capture.read()
            while ok:
                sample = self._sample(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), source, frame, fps)
                ok, bgr = capture.read()  # one frame ahead: the last frame knows it is the last
                yield sample
                frame += 1
            if frame == 0:
                yield _skip(source.path, f"no readable frame in the video (header: {max(claimed, 0)} frames)")
            elif (reason := video_shortfall(frame, claimed)) is not None:
                yield _skip(source.path, reason)
        finally:
            capture.release()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker = get_worker_info()
        mine = self.sources if worker is None else self.sources[worker.id :: worker.num_workers]
        for source in mine:
            if source.kind == "video":
                yield from self._frames(source)
                continue
            try:
                rgb = read_image(str(source.path), max_pixels=self.max_image_pixels)
            except ImageReadError as e:
                yield _skip(source.path, e.reason)
                continue
            yield self._sample(rgb, source, -1, 0.0)


def collate_prediction(samples: Sequence[dict[str, Any]]) -> PredictionBatch:
    """Stack ``PredictionSource`` samples into a ``PredictionBatch`` (``structures.batch``; module docstring).

    Failure placeholders are left out of the images (a batch may then hold B = 0 images).
    """
    problems = [s["problem"] for s in samples if "problem" in s]
    samples = [s for s in samples if "problem" not in s]
    if not samples:
        return {
            "images": torch.zeros(0, 3, 32, 32, dtype=torch.uint8), "scales": torch.zeros(0),
            "pads": torch.zeros(0, 2), "orig_sizes": torch.zeros(0, 2, dtype=torch.int64), "paths": [],
            "frames": [], "fps": [], "originals": [], "problems": problems,
        }  # fmt: skip
    return {
        "images": stack_images([s["image"] for s in samples]),
        "scales": torch.tensor([s["scale"] for s in samples], dtype=torch.float32),
        "pads": torch.tensor([s["pad"] for s in samples], dtype=torch.float32).reshape(-1, 2),
        "orig_sizes": torch.tensor([s["orig_size"] for s in samples], dtype=torch.int64).reshape(-1, 2),
        "paths": [s["path"] for s in samples],
        "frames": [s["frame"] for s in samples],
        "fps": [s["fps"] for s in samples],
        "originals": [s["original"] for s in samples],
        "problems": problems,
    }
