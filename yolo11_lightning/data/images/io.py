"""Reading images: one decoder (OpenCV) for checking and for training, so both agree on sizes.

``read_image`` is what the Dataset calls for every sample; ``probe_image`` is what the dataset
checker calls once per file (then the label cache remembers the answer). Both honour EXIF
orientation the way OpenCV's ``IMREAD_COLOR`` does, so a record's height/width are those of the
image as displayed, the frame YOLO labels are written in.

Truncation: OpenCV's ``imread`` fills a truncated JPEG with grey and returns it (only libjpeg
prints a warning), so we check the JPEG structure ourselves: an end-of-image marker must follow
the first scan. Only a marker after the scan header counts, so the EXIF thumbnail's own end
marker (inside APP1, before the scan) cannot fool it; entropy-coded data never contains FF D9.
"""

from __future__ import annotations

import math
import time

import cv2
import numpy as np

# Extensions picked up when a split points at a folder (lower case, without the dot).
IMAGE_EXTENSIONS = frozenset(
    {"bmp", "jpg", "jpeg", "jpe", "mpo", "png", "tif", "tiff", "webp", "pbm", "pgm", "ppm"}
)

_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Start-of-frame markers carrying the image size (C4 = DHT, C8 = JPG, CC = DAC are not frames).
_SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
# OpenCV >= 4.10 can hand back RGB directly, saving one full-image copy per sample.
_IMREAD_RGB = getattr(cv2, "IMREAD_COLOR_RGB", None)
# 1/f-scale JPEG decoding: the size bits alone (to combine with IMREAD_COLOR_RGB), and the BGR flags.
_REDUCED_BITS = {
    2: cv2.IMREAD_REDUCED_GRAYSCALE_2,
    4: cv2.IMREAD_REDUCED_GRAYSCALE_4,
    8: cv2.IMREAD_REDUCED_GRAYSCALE_8,
}
_REDUCED_BGR = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}


class ImageReadError(ValueError):
    """An image file that cannot be used; ``str(err)`` is ``"<path>: <reason>"``."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ImageReadError(path, f"cannot read file ({e.strerror or e})") from e
    if not data:
        raise ImageReadError(path, "empty file (0 bytes)")
    return data


def _jpeg_frame(path: str, data: bytes) -> tuple[int, int]:
    """(height, width) stored in a JPEG's frame header (before EXIF rotation); checks completeness.

    Walks the marker segments up to the first scan, then requires an end-of-image marker after it.
    Raises ImageReadError for a structure that ends early. Height 0 (size given later by a DNL
    marker, very rare) is returned as is; the caller then decodes fully.
    """
    i, n, size = 2, len(data), (0, 0)
    while i + 4 <= n:
        if data[i] != 0xFF:
            raise ImageReadError(path, f"corrupt JPEG (no marker at byte {i})")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte before a marker
            i += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # markers without a length field
            i += 2
            continue
        if marker == 0xD9:
            raise ImageReadError(path, "corrupt JPEG (end marker before any image data)")
        seg_end = i + 2 + int.from_bytes(data[i + 2 : i + 4], "big")
        if marker in _SOF_MARKERS and seg_end - i >= 9:
            size = (int.from_bytes(data[i + 5 : i + 7], "big"), int.from_bytes(data[i + 7 : i + 9], "big"))
        if marker == 0xDA:  # start of scan: entropy-coded data follows
            # The last FF D9 lies after the scan iff some FF D9 does: rfind stops near the end (fast),
            # where find would crawl through every FF of the entropy-coded data.
            if data.rfind(b"\xff\xd9") < seg_end:
                raise ImageReadError(path, "truncated JPEG (no end-of-image marker after the image data)")
            return size
        i = seg_end
    raise ImageReadError(path, "truncated JPEG (file ends inside the header)")


def _decode(path: str, data: bytes, flags: int) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    if img is None:
        kind = "PNG" if data.startswith(_PNG_MAGIC) else "JPEG" if data.startswith(_JPEG_MAGIC) else "image"
        what = f"corrupt or truncated {kind}" if kind != "image" else "not a readable image (unknown format)"
        raise ImageReadError(path, what)
    return img


def decode_scale(height: int, width: int, long_side: int) -> int:
    """Largest f of 2, 4, 8 whose 1/f-scale JPEG decode keeps the long side >= ``long_side``; else 1.

    libjpeg's scaled decode gives ceil(h / f) x ceil(w / f) pixels.
    """
    longest = max(height, width)
    for f in (8, 4, 2):
        if -(-longest // f) >= long_side:
            return f
    return 1


def read_image(path: str, long_side: int | None = None) -> np.ndarray:
    """Decode an image file to (H, W, 3) uint8 RGB, EXIF orientation applied.

    Grayscale is expanded to 3 channels, alpha is dropped, 16-bit is scaled to 8-bit (OpenCV
    ``IMREAD_COLOR`` semantics). Raises ImageReadError naming the file for unreadable, zero-byte,
    truncated or non-image files.

    With ``long_side``, a JPEG that a resize to that long side would shrink by 2x or more is decoded
    at 1/f scale instead (``decode_scale``; libjpeg's DCT scaling: the inverse DCT, chroma upsampling
    and colour conversion run at the reduced size, the entropy decoding does not; 1.2-1.6x faster):
    ceil(H / f) x ceil(W / f) pixels, long side still >= ``long_side``, a box-filtered view of the
    same image (within a few grey levels of a full decode shrunk by f). Other formats decode fully.
    """
    path = str(path)
    data = _read_bytes(path)
    scale = 1
    if data.startswith(_JPEG_MAGIC):
        h, w = _jpeg_frame(path, data)  # truncation check: ~1% of the decode time
        if long_side is not None and h > 0 and w > 0:
            scale = decode_scale(h, w, long_side)
    if scale > 1:
        if _IMREAD_RGB is not None:  # the reduced-size bits combine with the RGB flag
            return _decode(path, data, _REDUCED_BITS[scale] | _IMREAD_RGB)
        return cv2.cvtColor(_decode(path, data, _REDUCED_BGR[scale]), cv2.COLOR_BGR2RGB)
    if _IMREAD_RGB is not None:
        return _decode(path, data, _IMREAD_RGB)
    return cv2.cvtColor(_decode(path, data, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


def read_image_retrying(
    path: str, attempts: int = 3, backoff_s: float = 0.05, long_side: int | None = None
) -> np.ndarray:
    """``read_image`` tried ``attempts`` times, sleeping ``backoff_s``, 2x, 4x ... seconds in between.

    For files on network filesystems, where a read can fail once (a stale NFS handle, a file being
    replaced) and succeed a moment later. Raises the last ImageReadError when every attempt failed.
    ``long_side`` is passed on to ``read_image`` (reduced-size JPEG decoding).
    """
    for attempt in range(attempts):
        try:
            return read_image(path) if long_side is None else read_image(path, long_side)
        except ImageReadError:
            if attempt + 1 >= attempts:
                raise
            time.sleep(backoff_s * 2**attempt)
    raise ValueError(f"attempts must be >= 1, got {attempts}")


def probe_image(path: str) -> tuple[int, int]:
    """Check that an image decodes completely; return its (height, width) after EXIF rotation.

    JPEG (most datasets): the structure check above plus a decode at 1/8 scale, which still
    entropy-decodes every block (so corrupt data is caught) at about a third of the cost of a full
    decode. The full size comes from the frame header; whether OpenCV rotates it (EXIF orientation
    5-8) is read off the 1/8 image's shape, so the answer matches ``read_image`` by construction.
    Other formats are decoded fully. Raises ImageReadError with the reason.
    """
    path = str(path)
    data = _read_bytes(path)
    if data.startswith(_JPEG_MAGIC):
        h, w = _jpeg_frame(path, data)
        if h > 0 and w > 0:
            small = _decode(path, data, cv2.IMREAD_REDUCED_COLOR_8).shape[:2]
            stored, swapped = (math.ceil(h / 8), math.ceil(w / 8)), (math.ceil(w / 8), math.ceil(h / 8))
            if h == w or (small == stored and stored != swapped):
                return h, w
            if small == swapped and stored != swapped:
                return w, h
            # Near-square image whose 1/8 shape cannot tell a rotation apart: decode fully.
    img = _decode(path, data, cv2.IMREAD_COLOR)
    return int(img.shape[0]), int(img.shape[1])


def image_size(path: str) -> tuple[int, int]:
    """(height, width) of an image as displayed (after EXIF rotation); raises ImageReadError."""
    return probe_image(path)
