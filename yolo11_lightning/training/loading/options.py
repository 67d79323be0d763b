"""Refuse a ``YOLODataModule`` option of the wrong value before anything is read, in one line naming it."""

from __future__ import annotations

from yolo11_lightning.data.sampling.partner_pools import MODES as PARTNER_MODES
from yolo11_lightning.errors import UserInputError


def check_data_options(
    batch_size: int,
    image_size: int,
    num_workers: int | str,
    cache_images: bool | str,
    mosaic_partners: str,
    max_substituted_fraction: float,
) -> None:
    """Raise UserInputError naming the first ``data.<option>`` out of its range."""
    if batch_size <= 0:
        raise UserInputError(f"data.batch_size must be positive, got {batch_size}")
    if image_size <= 0 or image_size % 32:
        raise UserInputError(
            f"data.image_size must be a positive multiple of 32 (the largest stride), got {image_size}"
        )
    if num_workers != "auto" and (not isinstance(num_workers, int) or num_workers < 0):
        raise UserInputError(f"data.num_workers must be 'auto' or an int >= 0, got {num_workers!r}")
    if cache_images not in (True, False, "disk"):
        raise UserInputError(f"data.cache_images must be true, false or 'disk', got {cache_images!r}")
    if mosaic_partners not in PARTNER_MODES:
        raise UserInputError(f"data.mosaic_partners must be one of {PARTNER_MODES}, got {mosaic_partners!r}")
    if max_substituted_fraction < 0:
        raise UserInputError(f"data.max_substituted_fraction must be >= 0, got {max_substituted_fraction}")
