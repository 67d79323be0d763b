"""The pixel limit every image read honours, and the errors an unusable image raises.

A small file can claim a huge image (a decompression bomb); every read checks the size its header claims against
the limit before decoding (``headers``), and a decoded size afterwards when the header could not be parsed.
"""

from __future__ import annotations

from yolo11_lightning.errors import UserInputError

__all__ = [
    "DEFAULT_MAX_IMAGE_PIXELS",
    "LIMIT_OPTIONS",
    "ImageReadError",
    "ImageTooLargeError",
    "check_pixels",
    "pixel_limit",
]

# The reference's limit: Ultralytics checks every image with PIL, whose ``Image.open`` refuses one of more
# than 2 * ``Image.MAX_IMAGE_PIXELS`` pixels (``DecompressionBombError``; ``MAX_IMAGE_PIXELS`` =
# 1024^3 // 4 // 3 = 89,478,485, above which PIL only warns). 178,956,970 pixels is a 13,377 x 13,377
# image, 537 MB as decoded RGB, and far above any camera (a 100 MP sensor gives 1e8).
DEFAULT_MAX_IMAGE_PIXELS = 178_956_970


# How the limit is changed, for the refusal message.
LIMIT_OPTIONS = "--data.max_image_pixels, or --max_image_pixels of check-data and predict; 0: no limit"


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
