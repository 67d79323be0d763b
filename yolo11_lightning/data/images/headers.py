"""The size an image file's header claims, read before any decode: PNG, JPEG, TIFF/BigTIFF, WebP, BMP, GIF and the
PNM family, from the first bytes only (a TIFF's first IFD wherever it lies, a JPEG's segments up to its frame).
``read_at(offset, size)`` returns up to ``size`` bytes from ``offset`` (fewer at the end of the file); every parser
returns the (height, width) its header claims, or None when the bytes are not what it expects.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import BinaryIO

from yolo11_lightning.data.images.limits import ImageReadError

__all__ = ["JPEG_MAGIC", "PNG_MAGIC", "ReadAt", "header_image_size", "jpeg_walk", "safe_header_size"]

JPEG_MAGIC = b"\xff\xd8\xff"


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# Start-of-frame markers carrying the image size (C4 = DHT, C8 = JPG, CC = DAC are not frames).
_SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


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
    if head.startswith(PNG_MAGIC):
        return _png_size(head)
    if head.startswith(JPEG_MAGIC):
        try:
            size, _ = jpeg_walk("", read_at, file_size)
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
            return safe_header_size(f)
    except OSError as e:
        raise ImageReadError(path, f"cannot read file ({e.strerror or e})") from e


def safe_header_size(f: BinaryIO) -> tuple[int, int] | None:
    try:
        return _header_size(_file_reader(f), os.fstat(f.fileno()).st_size)
    except (OSError, OverflowError, ValueError, IndexError, struct.error):  # an offset past any file, ...
        return None


def safe_bytes_header_size(data: bytes) -> tuple[int, int] | None:
    """``safe_header_size`` of an image file's bytes held in memory."""
    try:
        return _header_size(lambda offset, size: data[offset : offset + size], len(data))
    except (OverflowError, ValueError, IndexError, struct.error):
        return None


def jpeg_walk(path: str, read_at: ReadAt, file_size: int) -> tuple[tuple[int, int], int]:
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
