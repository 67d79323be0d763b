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
(``header_image_size``: PNG, JPEG, TIFF/BigTIFF, WebP, BMP, GIF and the PNM family, from the first
bytes only; a TIFF's first IFD wherever it lies) and refuses an image above the pixel limit with
``ImageTooLargeError`` (an ``ImageReadError``, so every caller handles it like a corrupt file). The
limit defaults to the reference's (``DEFAULT_MAX_IMAGE_PIXELS``); None or 0 turns it off. A header
we cannot parse (another format, a malformed header) is decoded as before and the decoded size is
checked afterwards; OpenCV's own limit (``OPENCV_IO_MAX_IMAGE_PIXELS``, 2^30 pixels by default) bounds
that decode (its refusal, a ``cv2.error`` in OpenCV 5, becomes an ``ImageReadError`` too). We do not set that variable: OpenCV reads it once, when cv2 is imported (often before
this module), for the whole process, so it could not follow a per-dataset limit.
"""

from __future__ import annotations

import math
import os
import struct
import time
from collections.abc import Callable
from typing import BinaryIO

import cv2
import numpy as np

from yolo11_lightning.errors import UserInputError

# Extensions picked up when a split points at a folder (lower case, without the dot).
IMAGE_EXTENSIONS = frozenset(
    {"bmp", "jpg", "jpeg", "jpe", "mpo", "png", "tif", "tiff", "webp", "pbm", "pgm", "ppm"}
)

# The reference's limit: Ultralytics checks every image with PIL, whose ``Image.open`` refuses one of more
# than 2 * ``Image.MAX_IMAGE_PIXELS`` pixels (``DecompressionBombError``; ``MAX_IMAGE_PIXELS`` =
# 1024^3 // 4 // 3 = 89,478,485, above which PIL only warns). 178,956,970 pixels is a 13,377 x 13,377
# image, 537 MB as decoded RGB, and far above any camera (a 100 MP sensor gives 1e8).
DEFAULT_MAX_IMAGE_PIXELS = 178_956_970
# How the limit is changed, for the refusal message.
LIMIT_OPTIONS = "--data.max_image_pixels, or --max_image_pixels of check-data and predict; 0: no limit"

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


class ImageTooLargeError(ImageReadError):
    """An image whose width x height exceeds the pixel limit (a decompression bomb, or a mistake).

    Raised from the header's size before any decode (or from the decoded size for a header we cannot
    parse). Not a transient failure: ``read_image_retrying`` does not retry it.
    """

    def __init__(self, path: str, height: int, width: int, limit: int) -> None:
        self.height, self.width, self.limit = height, width, limit
        self.pixels = height * width
        super().__init__(
            path,
            f"{width}x{height} = {self.pixels} pixels exceeds the limit of {limit} pixels ({LIMIT_OPTIONS})",
        )


def pixel_limit(max_pixels: int | None) -> int | None:
    """The limit ``max_pixels`` sets: None for no limit (None or 0); raises ValueError for a negative one."""
    if max_pixels is None or max_pixels == 0:
        return None
    if max_pixels < 0:
        raise UserInputError(f"max_image_pixels must be >= 0 (0 or None: no limit), got {max_pixels}")
    return int(max_pixels)


def check_pixels(path: str, height: int, width: int, max_pixels: int | None) -> None:
    """Raise ``ImageTooLargeError`` when a (height, width) image exceeds ``max_pixels`` (None or 0: no limit)."""
    limit = pixel_limit(max_pixels)
    if limit is not None and height * width > limit:
        raise ImageTooLargeError(str(path), int(height), int(width), limit)


# ----------------------------------------------------------------------------------------- header sizes
# ``read_at(offset, size)`` returns up to ``size`` bytes from ``offset`` (fewer at the end of the file). Every
# parser below returns the (height, width) its header claims, or None when the bytes are not what it expects.
ReadAt = Callable[[int, int], bytes]
_TIFF_MAX_TAGS = 4096  # more entries in an IFD: not a TIFF we trust, decode as before
_PNM_HEADER_BYTES = 1 << 16  # a PNM header longer than this (comments) is left to the decoder


def _png_size(head: bytes) -> tuple[int, int] | None:
    """PNG: the IHDR chunk comes first: length, "IHDR", width and height (big-endian uint32)."""
    if len(head) < 24 or head[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", head[16:24])
    return height, width


def _tiff_size(read_at: ReadAt, head: bytes) -> tuple[int, int] | None:
    """TIFF and BigTIFF: ImageWidth (256) and ImageLength (257) of the first IFD, the page OpenCV decodes.

    Byte order from "II" / "MM"; each value SHORT (3), LONG (4) or, in BigTIFF, LONG8 (16), stored in the
    entry's value field. The IFD may lie anywhere in the file (libtiff writes it after the pixel data).
    """
    order = "<" if head[:2] == b"II" else ">"
    if head[2:4] in (b"+\0", b"\0+"):  # BigTIFF: bytesize 8, 0, then an 8-byte IFD offset
        if len(head) < 16:
            return None
        (offset,) = struct.unpack(order + "Q", head[8:16])
        count_format, entry_size, value_at = "Q", 20, 12
    else:
        (offset,) = struct.unpack(order + "I", head[4:8])
        count_format, entry_size, value_at = "H", 12, 8
    count_size = struct.calcsize(count_format)
    raw = read_at(offset, count_size)
    if len(raw) < count_size:
        return None
    (count,) = struct.unpack(order + count_format, raw)
    if count > _TIFF_MAX_TAGS:
        return None
    entries = read_at(offset + count_size, count * entry_size)
    found: dict[int, int] = {}
    for at in range(0, len(entries) - entry_size + 1, entry_size):
        tag, kind = struct.unpack(order + "HH", entries[at : at + 4])
        if tag not in (256, 257):
            continue
        value_format = {3: "H", 4: "I", 16: "Q"}.get(kind)
        if value_format is None or (kind == 16 and entry_size == 12):
            return None
        field = entries[at + value_at : at + entry_size]
        (found[tag],) = struct.unpack(order + value_format, field[: struct.calcsize(value_format)])
    if 256 not in found or 257 not in found:
        return None
    return found[257], found[256]


def _webp_size(head: bytes) -> tuple[int, int] | None:
    """WebP: "RIFF" size "WEBP", then the first chunk: "VP8 " (lossy), "VP8L" (lossless) or "VP8X" (extended)."""
    if len(head) < 30:
        return None
    chunk = head[12:16]
    if chunk == b"VP8 ":  # frame tag (3 bytes), start code 9d 01 2a, then 14-bit width and height
        if head[23:26] != b"\x9d\x01\x2a":
            return None
        width, height = struct.unpack("<HH", head[26:30])
        return height & 0x3FFF, width & 0x3FFF  # the top 2 bits are an upscaling hint
    if chunk == b"VP8L":  # signature 0x2f, then 14 bits of width - 1 and 14 bits of height - 1
        if head[20] != 0x2F:
            return None
        bits = int.from_bytes(head[21:25], "little")
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    if chunk == b"VP8X":  # flags (4 bytes), then 24 bits of canvas width - 1 and of canvas height - 1
        return int.from_bytes(head[27:30], "little") + 1, int.from_bytes(head[24:27], "little") + 1
    return None


def _bmp_size(head: bytes) -> tuple[int, int] | None:
    """BMP: the DIB header after the 14-byte file header. BITMAPCOREHEADER (12 bytes): uint16 width and
    height; every later one (BITMAPINFOHEADER and its extensions): int32, a negative height meaning
    rows stored top-down."""
    if len(head) < 26:
        return None
    header_size = int.from_bytes(head[14:18], "little")
    if header_size == 12:
        width, height = struct.unpack("<HH", head[18:22])
    elif header_size >= 16:
        width, height = struct.unpack("<ii", head[18:26])
    else:
        return None
    return abs(height), abs(width)


def _gif_size(head: bytes) -> tuple[int, int] | None:
    """GIF: the logical screen's uint16 width and height after "GIF87a" / "GIF89a"."""
    if len(head) < 10:
        return None
    width, height = struct.unpack("<HH", head[6:10])
    return height, width


def _pnm_size(header: bytes) -> tuple[int, int] | None:
    """PBM/PGM/PPM (P1-P6) and PFM (PF, Pf): ASCII width and height after the magic, ``#`` comments running
    to the end of their line; PAM (P7): ``WIDTH`` and ``HEIGHT`` lines before ``ENDHDR``."""
    # Whole lines only: the last piece may be cut off by the read, or be pixel data.
    lines = [line.split(b"#", 1)[0].split() for line in header.split(b"\n")[:-1]]
    if header.startswith(b"P7"):
        fields: dict[bytes, bytes] = {}
        for words in lines[1:]:
            if words[:1] == [b"ENDHDR"]:
                break
            if len(words) >= 2:
                fields[words[0]] = words[1]
        width, height = fields.get(b"WIDTH", b""), fields.get(b"HEIGHT", b"")
    else:
        tokens = [token for words in lines for token in words][:3]  # magic, width, height
        width, height = (tokens[1], tokens[2]) if len(tokens) == 3 else (b"", b"")
    if not (width.isdigit() and height.isdigit()):
        return None
    return int(height), int(width)


def _header_size(read_at: ReadAt, file_size: int) -> tuple[int, int] | None:
    """(height, width) a file's header claims, before EXIF rotation; None for a format or header we do
    not parse. Reads only the header's bytes (30 for most formats, the segments up to the frame header
    of a JPEG, the first IFD of a TIFF, at most 64 KB of a PNM header)."""
    head = read_at(0, 32)
    if head.startswith(_PNG_MAGIC):
        return _png_size(head)
    if head.startswith(_JPEG_MAGIC):
        try:
            size, _ = _jpeg_walk("", read_at, file_size)
        except ImageReadError:  # decoding (and the structure check) will say what is wrong
            return None
        return size if size[0] > 0 else None  # height 0: given later by a DNL marker
    if head[:4] in (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+"):
        return _tiff_size(read_at, head)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp_size(head)
    if head[:2] == b"BM":
        return _bmp_size(head)
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return _gif_size(head)
    if head[:1] == b"P" and head[1:2] in (b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"F", b"f"):
        return _pnm_size(read_at(0, _PNM_HEADER_BYTES))
    return None


def _file_reader(f: BinaryIO) -> ReadAt:
    def read_at(offset: int, size: int) -> bytes:
        f.seek(offset)
        return f.read(size)

    return read_at


def header_image_size(path: str) -> tuple[int, int] | None:
    """(height, width) an image file's header claims (before EXIF rotation), reading the header only.

    None when the format is not one we parse (PNG, JPEG, TIFF, WebP, BMP, GIF, PNM) or its header is
    malformed. Raises ImageReadError when the file cannot be opened.
    """
    path = str(path)
    try:
        with open(path, "rb") as f:
            return _safe_header_size(f)
    except OSError as e:
        raise ImageReadError(path, f"cannot read file ({e.strerror or e})") from e


def _safe_header_size(f: BinaryIO) -> tuple[int, int] | None:
    try:
        return _header_size(_file_reader(f), os.fstat(f.fileno()).st_size)
    except (OSError, OverflowError, ValueError, IndexError, struct.error):  # an offset past any file, ...
        return None


def _read_bytes(path: str, max_pixels: int | None) -> tuple[bytes, tuple[int, int] | None]:
    """The file's bytes and its header's (height, width) (None: not parsed), read only once the header's
    size is within ``max_pixels`` (else ``ImageTooLargeError``, having read the header alone)."""
    try:
        with open(path, "rb") as f:
            size = _safe_header_size(f)
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


def _jpeg_walk(path: str, read_at: ReadAt, file_size: int) -> tuple[tuple[int, int], int]:
    """(height, width) stored in a JPEG's frame header (before EXIF rotation), and the offset where the
    first scan's entropy-coded data starts.

    Walks the marker segments up to the first scan, reading 4 bytes per segment (and the frame header).
    Raises ImageReadError for a structure that ends early. Height 0 (size given later by a DNL marker,
    very rare) is returned as is; (0, 0) when no frame header precedes the scan.
    """
    i, size = 2, (0, 0)
    while i + 4 <= file_size:
        segment = read_at(i, 4)
        if len(segment) < 4 or segment[0] != 0xFF:
            raise ImageReadError(path, f"corrupt JPEG (no marker at byte {i})")
        marker = segment[1]
        if marker == 0xFF:  # fill byte before a marker
            i += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # markers without a length field
            i += 2
            continue
        if marker == 0xD9:
            raise ImageReadError(path, "corrupt JPEG (end marker before any image data)")
        seg_end = i + 2 + int.from_bytes(segment[2:4], "big")
        if marker in _SOF_MARKERS and seg_end - i >= 9:
            frame = read_at(i + 5, 4)
            size = (int.from_bytes(frame[0:2], "big"), int.from_bytes(frame[2:4], "big"))
        if marker == 0xDA:  # start of scan: entropy-coded data follows
            return size, seg_end
        i = seg_end
    raise ImageReadError(path, "truncated JPEG (file ends inside the header)")


def _jpeg_frame(path: str, data: bytes) -> tuple[int, int]:
    """(height, width) stored in a JPEG's frame header (before EXIF rotation); checks completeness.

    ``_jpeg_walk`` over the bytes, then requires an end-of-image marker after the first scan. Raises
    ImageReadError for a structure that ends early. Height 0 (DNL) is returned as is; the caller then
    decodes fully.
    """
    size, scan = _jpeg_walk(path, lambda offset, n: data[offset : offset + n], len(data))
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
    scale = 1
    if data.startswith(_JPEG_MAGIC):
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
    _check_decoded(path, img, size, max_pixels)
    return int(img.shape[0]), int(img.shape[1])


def image_size(path: str, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS) -> tuple[int, int]:
    """(height, width) of an image as displayed (after EXIF rotation); raises ImageReadError."""
    return probe_image(path, max_pixels)
