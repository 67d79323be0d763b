"""Helpers for the data-source tests: tiny image files, including broken and EXIF-rotated ones."""

from __future__ import annotations

import struct
import zlib
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


# -- decompression bombs: small files whose headers claim huge images ------------------------------------------
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(width: int = 30000, height: int = 30000) -> bytes:
    """A valid, fully decodable 1-bit black PNG of width x height pixels (30000^2: ~110 KB, 2.7 GB as RGB).

    The rows are deflated as a stream, so the image is never allocated here.
    """
    row = b"\0" * (1 + (width + 7) // 8)  # filter byte 0, then the packed bits
    per_chunk = max(1, (1 << 22) // len(row))
    deflate, parts, left = zlib.compressobj(9), [], height
    while left:
        n = min(left, per_chunk)
        parts.append(deflate.compress(row * n))
        left -= n
    parts.append(deflate.flush())
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1 bit, grayscale
    return (
        PNG_MAGIC
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", b"".join(parts))
        + _png_chunk(b"IEND", b"")
    )


def tiff_bytes(
    width: int,
    height: int,
    order: str = "<",
    size_type: int = 4,
    bigtiff: bool = False,
    strip: bytes | None = None,
) -> bytes:
    """A one-strip 8-bit grayscale TIFF whose header says width x height; IFD after the strip (as libtiff writes).

    ``strip``: the pixel data, deflated (compression 8); None: a few deflated zero bytes (the header lies).
    ``size_type``: 3 (SHORT) or 4 (LONG) for the width and height tags (16, LONG8, needs ``bigtiff``).
    """
    strip = zlib.compress(b"\0" * 64) if strip is None else strip
    head_size = 16 if bigtiff else 8
    tags = [  # (tag, type, value): all single values
        (256, size_type, width), (257, size_type, height), (258, 3, 8), (259, 3, 8), (262, 3, 1),
        (273, 4, head_size), (277, 3, 1), (278, 4, height), (279, 4, len(strip)),
    ]  # fmt: skip
    value_format = {3: "H", 4: "I", 16: "Q"}
    ifd_offset = head_size + len(strip)
    if bigtiff:
        head = (b"II" if order == "<" else b"MM") + struct.pack(order + "HHHQ", 43, 8, 0, ifd_offset)
        ifd = struct.pack(order + "Q", len(tags))
        for tag, kind, value in tags:
            field = struct.pack(order + value_format[kind], value).ljust(8, b"\0")
            ifd += struct.pack(order + "HHQ", tag, kind, 1) + field
        ifd += struct.pack(order + "Q", 0)
    else:
        head = (b"II" if order == "<" else b"MM") + struct.pack(order + "HI", 42, ifd_offset)
        ifd = struct.pack(order + "H", len(tags))
        for tag, kind, value in tags:
            field = struct.pack(order + value_format[kind], value).ljust(4, b"\0")
            ifd += struct.pack(order + "HHI", tag, kind, 1) + field
        ifd += struct.pack(order + "I", 0)
    return head + strip + ifd


def tiff_bomb(width: int = 20000, height: int = 20000) -> bytes:
    """A valid, fully decodable deflated black TIFF (20000^2: ~400 KB, 1.2 GB as RGB), streamed."""
    deflate, parts, left = zlib.compressobj(9), [], height
    per_chunk = max(1, (1 << 22) // width)
    while left:
        n = min(left, per_chunk)
        parts.append(deflate.compress(b"\0" * (width * n)))
        left -= n
    parts.append(deflate.flush())
    return tiff_bytes(width, height, strip=b"".join(parts))


def jpeg_claiming(width: int, height: int) -> bytes:
    """A small complete JPEG whose frame header (SOF) claims width x height (each at most 65535)."""
    data = bytearray(cv2.imencode(".jpg", pattern(16, 16))[1].tobytes())
    i = 2
    while data[i + 1] not in (0xC0, 0xC1, 0xC2):  # walk the segments to the frame header
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    data[i + 5 : i + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def webp_claiming(width: int, height: int, kind: str = "VP8L") -> bytes:
    """A small WebP whose header claims width x height: "VP8 " (lossy, <= 16383), "VP8L" (lossless,
    <= 16384) or "VP8X" (extended: the canvas size, <= 2^24, before a real 16 x 16 lossy frame)."""
    lossless = kind == "VP8L"
    params = [cv2.IMWRITE_WEBP_QUALITY, 101 if lossless else 80]
    data = bytearray(cv2.imencode(".webp", pattern(16, 16), params)[1].tobytes())
    assert data[12:16] == (b"VP8L" if lossless else b"VP8 "), bytes(data[12:16])
    if kind == "VP8 ":
        data[26:30] = struct.pack("<HH", width, height)
    elif kind == "VP8L":
        bits = (width - 1) | (height - 1) << 14 | (int.from_bytes(data[21:25], "little") & ~((1 << 28) - 1))
        data[21:25] = bits.to_bytes(4, "little")
    else:
        vp8x = b"VP8X" + struct.pack("<I", 10) + b"\0" * 4 + (width - 1).to_bytes(3, "little")
        vp8x += (height - 1).to_bytes(3, "little")
        body = b"WEBP" + vp8x + bytes(data[12:])
        return b"RIFF" + struct.pack("<I", len(body)) + body
    return bytes(data)


def bmp_claiming(width: int, height: int) -> bytes:
    """A small BMP whose BITMAPINFOHEADER claims width x height (negative height: rows stored top-down)."""
    data = bytearray(cv2.imencode(".bmp", pattern(16, 16))[1].tobytes())
    data[18:26] = struct.pack("<ii", width, height)
    return bytes(data)
