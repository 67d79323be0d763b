"""The reference's classification pipeline on torchvision's transforms (``torchvision.transforms.v2``, PIL images).

Training (the reference's ``classify_augmentations`` with its trainer's arguments): ``RandomResizedCrop`` to
``size`` (scale ``(1 - scale_jitter, 1)``, ratio (3/4, 4/3), bilinear), horizontal / vertical flips, then
RandAugment (``auto_augment="randaugment"``, the default; ``"autoaugment"``, ``"augmix"``) or, without one, a
``ColorJitter`` (brightness and contrast ``hsv_v``, saturation ``hsv_s``, hue ``hsv_h``), and ``RandomErasing``
(probability ``erasing``, erased pixels 0 as the reference's on its [0, 1] tensor). Evaluation
(``classify_transforms``): shortest side resized to ``size`` (bilinear), centre crop ``size``.

Both run on the image as the loader keeps it (``ClassifyTransform.fit``, what the image cache holds). Evaluation
keeps the shortest side resized to ``size``, its own first step, so a cached image is what it resizes to. Training
keeps the image as it is when its shortest side is at most ``load_side`` (the side at which the smallest crop the
augmentation draws, ``sqrt(min scale x 3/4)`` of the shortest side, still covers ``size`` pixels), else shrinks it
to that side: every crop is then made from at least as many pixels as it is resized to, as the reference's crops
of the full image are, at a bounded memory per cached image (an image whose shortest side is at most
``load_side`` is cropped from the file's own pixels, exactly as the reference crops it). Every random draw of a sample comes
from torch's generator seeded by the sample's own seed (``__call__(image, seed)``, the caller's per-sample seed),
inside ``torch.random.fork_rng``: a sample is a function of (seed, epoch, index) only, whatever the worker
count or world size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import InterpolationMode, v2

__all__ = ["AUTO_AUGMENTS", "ClassifyAugment", "ClassifyTransform", "short_side_shape"]

AUTO_AUGMENTS = ("randaugment", "autoaugment", "augmix")
BILINEAR = InterpolationMode.BILINEAR


@dataclass(frozen=True)
class ClassifyAugment:
    """The training augmentation's settings (the reference's argument names in brackets).

    scale_jitter: crops cover ``(1 - scale_jitter, 1)`` of the image area (``scale``; 0.5: (0.5, 1)).
    fliplr, flipud: flip probabilities. auto_augment: one of ``AUTO_AUGMENTS`` or None (then ColorJitter with
    ``hsv_h``, ``hsv_s``, ``hsv_v``). erasing: RandomErasing probability.
    """

    scale_jitter: float = 0.5
    fliplr: float = 0.5
    flipud: float = 0.0
    auto_augment: str | None = "randaugment"
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    erasing: float = 0.4

    def __post_init__(self) -> None:
        if self.auto_augment not in (None, *AUTO_AUGMENTS):
            raise ValueError(
                f"auto_augment must be one of {AUTO_AUGMENTS} or None, got {self.auto_augment!r}"
            )
        if not 0.0 <= self.scale_jitter < 1.0:
            raise ValueError(
                f"scale_jitter must be in [0, 1) for classification crops, got {self.scale_jitter}"
            )
        if not 0.0 <= self.erasing < 1.0:
            raise ValueError(f"erasing must be in [0, 1), got {self.erasing}")


def short_side_shape(height: int, width: int, size: int) -> tuple[int, int]:
    """Returns the (h', w') of an image whose shortest side is resized to ``size``.

    torchvision's ``Resize(size)`` rule: the long side becomes ``int(size * long / short)``.
    """
    if height <= width:
        return size, int(size * width / height)
    return int(size * height / width), size


class ClassifyTransform:
    """One split's pipeline: ``fit`` (what the loader keeps of an image) and ``__call__`` (the sample).

    Images are (H, W, 3) uint8 RGB arrays; the sample is (size, size, 3) uint8 RGB.
    """

    def __init__(self, size: int, augment: ClassifyAugment | None = None) -> None:
        self.size = size
        self.augment = augment
        if augment is None:
            self.transform = v2.CenterCrop(size)
            return
        steps: list = [
            v2.RandomResizedCrop(size, scale=(1.0 - augment.scale_jitter, 1.0), ratio=(3 / 4, 4 / 3),
                                 interpolation=BILINEAR),
        ]  # fmt: skip
        if augment.fliplr > 0:
            steps.append(v2.RandomHorizontalFlip(augment.fliplr))
        if augment.flipud > 0:
            steps.append(v2.RandomVerticalFlip(augment.flipud))
        if augment.auto_augment == "randaugment":
            steps.append(v2.RandAugment(interpolation=BILINEAR))
        elif augment.auto_augment == "autoaugment":
            steps.append(v2.AutoAugment(interpolation=BILINEAR))
        elif augment.auto_augment == "augmix":
            steps.append(v2.AugMix(interpolation=BILINEAR))
        else:
            steps.append(
                v2.ColorJitter(brightness=augment.hsv_v, contrast=augment.hsv_v, saturation=augment.hsv_s,
                               hue=augment.hsv_h)
            )  # fmt: skip
        steps.append(v2.PILToTensor())
        if augment.erasing > 0:
            steps.append(v2.RandomErasing(p=augment.erasing, value=0))
        self.transform = v2.Compose(steps)

    @property
    def load_side(self) -> int:
        """The shortest side ``fit`` keeps at most in training (module docstring); ``size`` in evaluation."""
        if self.augment is None:
            return self.size
        return math.ceil(self.size / math.sqrt((1.0 - self.augment.scale_jitter) * 3 / 4))

    def load_shape(self, height: int, width: int) -> tuple[int, int]:
        """Returns the (h', w') of fit's output for an image of (height, width)."""
        if self.augment is not None and min(height, width) <= self.load_side:
            return height, width
        return short_side_shape(height, width, self.load_side)

    def fit(self, image: np.ndarray) -> np.ndarray:
        """Resizes an image for the loader: shortest side to ``size``, or in training to ``load_side``.

        In training only a longer side is shrunk. Both are bilinear, PIL's antialiased resize as the
        reference's ``Resize``.
        """
        h, w = self.load_shape(image.shape[0], image.shape[1])
        if (h, w) == image.shape[:2]:
            return image
        return np.array(Image.fromarray(image).resize((w, h), Image.Resampling.BILINEAR))

    def __call__(self, image: np.ndarray, seed: int = 0) -> np.ndarray:
        """Returns the (size, size, 3) uint8 sample of a fit output or of any (H, W, 3) uint8 RGB image.

        Evaluation resizes an image that is not ``fit`` yet, then centre-crops; training draws from torch's
        generator seeded by ``seed``."""
        if self.augment is None:
            return np.array(self.transform(Image.fromarray(self.fit(image))))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = self.transform(Image.fromarray(image))
        return out.permute(1, 2, 0).numpy()
