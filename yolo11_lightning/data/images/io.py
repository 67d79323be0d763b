"""Reading images: one decoder (OpenCV) for checking and for training, so both agree on sizes.

``read_image`` is what the Dataset calls for every sample; ``probe_image`` is what the dataset
checker calls once per file (then the label cache remembers the answer). Both honour EXIF
orientation the way OpenCV's ``IMREAD_COLOR`` does, so a record's height/width are those of the
image as displayed, the frame YOLO labels are written in.

Truncation: OpenCV's ``imread`` fills a truncated JPEG with grey and returns it (only libjpeg
prints a warning), so we check the JPEG structure ourselves: an end-of-image marker must follow
the first scan. Only a marker after the scan header counts, so the EXIF thumbnail's own end
marker (inside APP1, before the scan) cannot fool it; entropy-coded data never contains FF D9.

Decompression bombs: a small file can claim a huge image (a 30000 x 30000 black PNG is 110 KB and
decodes to 2.7 GB of RGB). Before any decode, every read parses the size its header claims
(``headers.header_image_size``) and refuses an image above the pixel limit with
``limits.ImageTooLargeError`` (an ``ImageReadError``, so every caller handles it like a corrupt file). The
limit defaults to the reference's (``DEFAULT_MAX_IMAGE_PIXELS``); None or 0 turns it off. A header
we cannot parse (another format, a malformed header) is decoded as before and the decoded size is
checked afterwards; OpenCV's own limit (``OPENCV_IO_MAX_IMAGE_PIXELS``, 2^30 pixels by default) bounds
that decode (its refusal, a ``cv2.error`` in OpenCV 5, becomes an ``ImageReadError`` too). We do not set that variable: OpenCV reads it once, when cv2 is imported (often before
this module), for the whole process, so it could not follow a per-dataset limit.
"""

from __future__ import annotations

import math
import time

import cv2
import numpy as np

from yolo11_lightning.data.images.headers import (
    JPEG_MAGIC,
    PNG_MAGIC,
    jpeg_walk,
    safe_bytes_header_size,
    safe_header_size,
)
from yolo11_lightning.data.images.limits import (
    DEFAULT_MAX_IMAGE_PIXELS,
    ImageReadError,
    ImageTooLargeError,
    check_pixels,
)

# Extensions picked up when a split points at a folder (lower case, without the dot).
IMAGE_EXTENSIONS = frozenset(
    {"bmp", "jpg", "jpeg", "jpe", "mpo", "png", "tif", "tiff", "webp", "pbm", "pgm", "ppm"}
)


# OpenCV >= 4.10 can hand back RGB directly, saving one full-image copy per sample.
_IMREAD_RGB = getattr(cv2, "IMREAD_COLOR_RGB", None)
# 1/f-scale JPEG decoding: the size bits alone (to combine with IMREAD_COLOR_RGB), and the BGR flags.
_REDUCED_BITS = {
    2: cv2.IMREAD_REDUCED_GRAYSCALE_2,
    4: cv2.IMREAD_REDUCED_GRAYSCALE_4,
    8: cv2.IMREAD_REDUCED_GRAYSCALE_8,
}
_REDUCED_BGR = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}


def _read_bytes(path: str, max_pixels: int | None) -> tuple[bytes, tuple[int, int] | None]:
    """The file's bytes and its header's (height, width) (None: not parsed), read only once the header's
    size is within ``max_pixels`` (else ``ImageTooLargeError``, having read the header alone)."""
    try:
        with open(path, "rb") as f:
            size = safe_header_size(f)
            if size is not None:
                check_pixels(path, size[0], size[1], max_pixels)
            f.seek(0)
            data = f.read()
    except OSError as e:
        raise ImageReadError(path, f"cannot read file ({e.strerror or e})") from e
    if not data:
        raise ImageReadError(path, "empty file (0 bytes)")
    return data, size


def _check_decoded(
    path: str, image: np.ndarray, size: tuple[int, int] | None, max_pixels: int | None
) -> None:
    """The decoded size against the limit, for an image whose header size was not known before decoding."""
    if size is None:
        check_pixels(path, image.shape[0], image.shape[1], max_pixels)


def _jpeg_frame(path: str, data: bytes) -> tuple[int, int]:
    """(height, width) stored in a JPEG's frame header (before EXIF rotation); checks completeness.

    ``jpeg_walk`` over the bytes, then requires an end-of-image marker after the first scan. Raises
    ImageReadError for a structure that ends early. Height 0 (DNL) is returned as is; the caller then
    decodes fully.
    """
    size, scan = jpeg_walk(path, lambda offset, n: data[offset : offset + n], len(data))
    # The last FF D9 lies after the scan iff some FF D9 does: rfind stops near the end (fast),
    # where find would crawl through every FF of the entropy-coded data.
    if data.rfind(b"\xff\xd9") < scan:
        raise ImageReadError(path, "truncated JPEG (no end-of-image marker after the image data)")
    return size


def _decode(path: str, data: bytes, flags: int) -> np.ndarray:
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    except cv2.error as e:  # OpenCV 5 raises (not None) for a header beyond its own size limits
        message = str(e).strip().splitlines()[-1]
        if "validateInputImageSize" in message:
            message = "its header claims more pixels than OpenCV's limit (OPENCV_IO_MAX_IMAGE_PIXELS)"
        raise ImageReadError(path, f"not decodable: {message}") from e
    if img is None:
        kind = "PNG" if data.startswith(PNG_MAGIC) else "JPEG" if data.startswith(JPEG_MAGIC) else "image"
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


def read_image(
    path: str, long_side: int | None = None, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
) -> np.ndarray:
    """Decode an image file to (H, W, 3) uint8 RGB, EXIF orientation applied.

    Grayscale is expanded to 3 channels, alpha is dropped, 16-bit is scaled to 8-bit (OpenCV
    ``IMREAD_COLOR`` semantics). Raises ImageReadError naming the file for unreadable, zero-byte,
    truncated or non-image files, and ``ImageTooLargeError`` for one of more than ``max_pixels`` pixels
    (None or 0: no limit), refused from its header before decoding.

    With ``long_side``, a JPEG that a resize to that long side would shrink by 2x or more is decoded
    at 1/f scale instead (``decode_scale``; libjpeg's DCT scaling: the inverse DCT, chroma upsampling
    and colour conversion run at the reduced size, the entropy decoding does not; 1.2-1.6x faster):
    ceil(H / f) x ceil(W / f) pixels, long side still >= ``long_side``, a box-filtered view of the
    same image (within a few grey levels of a full decode shrunk by f). Other formats decode fully.
    """
    path = str(path)
    data, size = _read_bytes(path, max_pixels)
    return _decode_image(path, data, size, long_side, max_pixels)


def decode_image_bytes(
    name: str, data: bytes, long_side: int | None = None, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
) -> np.ndarray:
    """``read_image`` of an image file's bytes already read (a shard member); ``name`` names it in errors."""
    if not data:
        raise ImageReadError(name, "empty file (0 bytes)")
    size = safe_bytes_header_size(data)
    if size is not None:
        check_pixels(name, size[0], size[1], max_pixels)
    return _decode_image(name, data, size, long_side, max_pixels)


def _decode_image(
    path: str, data: bytes, size: tuple[int, int] | None, long_side: int | None, max_pixels: int | None
) -> np.ndarray:
    """The decode of ``read_image`` once the bytes are read and their header size (``size``) checked."""
    scale = 1
    if data.startswith(JPEG_MAGIC):
        h, w = _jpeg_frame(path, data)  # truncation check: ~1% of the decode time
        if long_side is not None and h > 0 and w > 0:
            scale = decode_scale(h, w, long_side)
    if scale > 1:  # a JPEG whose frame header gave its size: checked already
        if _IMREAD_RGB is not None:  # the reduced-size bits combine with the RGB flag
            return _decode(path, data, _REDUCED_BITS[scale] | _IMREAD_RGB)
        return cv2.cvtColor(_decode(path, data, _REDUCED_BGR[scale]), cv2.COLOR_BGR2RGB)
    if _IMREAD_RGB is not None:
        image = _decode(path, data, _IMREAD_RGB)
    else:
        image = cv2.cvtColor(_decode(path, data, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    _check_decoded(path, image, size, max_pixels)
    return image


def read_image_retrying(
    path: str,
    attempts: int = 3,
    backoff_s: float = 0.05,
    long_side: int | None = None,
    max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
) -> np.ndarray:
    """``read_image`` tried ``attempts`` times, sleeping ``backoff_s``, 2x, 4x ... seconds in between.

    For files on network filesystems, where a read can fail once (a stale NFS handle, a file being
    replaced) and succeed a moment later. Raises the last ImageReadError when every attempt failed;
    ``ImageTooLargeError`` at once (a file's size does not heal). ``long_side`` (reduced-size JPEG
    decoding) and ``max_pixels`` are passed on to ``read_image``.
    """
    for attempt in range(attempts):
        try:
            return read_image(path, long_side, max_pixels)
        except ImageTooLargeError:
            raise
        except ImageReadError:
            if attempt + 1 >= attempts:
                raise
            time.sleep(backoff_s * 2**attempt)
    raise ValueError(f"attempts must be >= 1, got {attempts}")


def probe_image(path: str, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS) -> tuple[int, int]:
    """Check that an image decodes completely; return its (height, width) after EXIF rotation.

    The header's size is checked against ``max_pixels`` first (``ImageTooLargeError``, nothing decoded;
    None or 0: no limit). JPEG (most datasets): the structure check above plus a decode at 1/8 scale,
    which still entropy-decodes every block (so corrupt data is caught) at about a third of the cost of
    a full decode. The full size comes from the frame header; whether OpenCV rotates it (EXIF orientation
    5-8) is read off the 1/8 image's shape, so the answer matches ``read_image`` by construction.
    Other formats are decoded fully. Raises ImageReadError with the reason.
    """
    path = str(path)
    data, size = _read_bytes(path, max_pixels)
    if data.startswith(JPEG_MAGIC):
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
    _check_decoded(path, img, size, max_pixels)
    return int(img.shape[0]), int(img.shape[1])


def image_size(path: str, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS) -> tuple[int, int]:
    """(height, width) of an image as displayed (after EXIF rotation); raises ImageReadError."""
    return probe_image(path, max_pixels)
