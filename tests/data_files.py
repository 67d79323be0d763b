"""Helpers for the data-source tests: tiny image files, including broken and EXIF-rotated ones."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import yaml


def pattern(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A smooth random RGB image (H, W, 3) uint8: compresses well, decodes to a known size."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(height // 8, 1), max(width // 8, 1), 3), dtype=np.uint8)
    return cv2.resize(small, (width, height), interpolation=cv2.INTER_LINEAR)


def write_image(path: Path, image: np.ndarray) -> Path:
    """Write an RGB (or single-channel / RGBA / 16-bit) image; format from the extension."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if image.ndim == 3 and image.shape[2] == 3:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    assert cv2.imwrite(str(path), image), path
    return path


def jpeg_with_orientation(image: np.ndarray, orientation: int) -> bytes:
    """JPEG bytes of an RGB image (as stored) with an EXIF Orientation tag (1-8)."""
    ok, encoded = cv2.imencode(".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    assert ok
    # Big-endian TIFF header, IFD0 with one entry: tag 0x0112 (Orientation), SHORT, count 1.
    ifd = b"\x00\x01" + b"\x01\x12\x00\x03\x00\x00\x00\x01" + orientation.to_bytes(2, "big") + b"\x00\x00"
    tiff = b"MM\x00\x2a\x00\x00\x00\x08" + ifd + b"\x00\x00\x00\x00"
    payload = b"Exif\x00\x00" + tiff
    data = encoded.tobytes()
    return data[:2] + b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload + data[2:]


def write_labels(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def write_yaml(path: Path, content: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(content))
    return path
