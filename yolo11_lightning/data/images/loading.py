"""``RecordImageLoader``: reading a dataset record's image (retries, reduced decode, resize, substitutes).

The loading half of ``BoxDataset`` (a mixin of it): it reads the attributes ``BoxDataset``
sets (``records``, ``image_size``, ``augment``, ``scaleup``, ``image_cache``, ``seed``, ``label_fields``,
``decode_cache_size``, ``read_attempts``, ``retry_backoff_s``, ``reduced_decode``, ``max_image_pixels``,
``image_bytes`` and the per-process ``_decoded`` / ``_unreadable`` memories) and needs ``__len__``.

Images are files at the records' paths, or, with ``image_bytes`` (a shard folder's ``ShardImages``), bytes it
reads by index, the record's path being the sample's tar member.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Protocol

import cv2
import numpy as np

from yolo11_lightning.data.augment.pipeline import Labelled
from yolo11_lightning.data.augment.transforms import resize_long_side
from yolo11_lightning.data.images.cache import resized_shape
from yolo11_lightning.data.images.io import decode_image_bytes, decode_scale, read_image_retrying
from yolo11_lightning.data.images.limits import ImageReadError, check_pixels
from yolo11_lightning.data.rect_batches import eval_resize, eval_resized_shape
from yolo11_lightning.data.sampling.seeds import substitute_index
from yolo11_lightning.structures.instances import Instances

# First entropy word of the generator choosing the substitute of an unreadable training image.
SUBSTITUTE_STREAM = 2
# Candidates tried in turn for an unreadable training image before a blank image stands in.
MAX_SUBSTITUTE_TRIES = 16
# ``substitutes`` entry of a sample whose image and every candidate were unreadable (grey, no labels).
BLANK_SUBSTITUTE = -2


class ImageBytes(Protocol):
    """Where a dataset's image bytes come from when they are not files (``data.shards.reader.ShardImages``)."""

    def read(self, index: int, member: str) -> bytes:
        """The bytes of sample ``index`` (whose record's path is ``member``); ImageReadError when unreadable."""
        ...

    shard: np.ndarray  # (N,) the shard of each sample

    def name(self, index: int, member: str) -> str:
        """How messages name sample ``index``."""
        ...

    def prefetch(self, epoch: int, shard_numbers: Iterable[int]) -> None:
        """Start fetching these shards in the background (training reads them next)."""
        ...


class RecordImageLoader:
    """Mixin of ``BoxDataset``: a record's image, decoded, resized, or substituted when unreadable."""

    def load_resized(self, index: int) -> tuple[np.ndarray, float]:
        """Image ``index`` with its long side resized to ``image_size``: ((h', w', 3) uint8 RGB, scale r).

        Evaluation resizes as the reference validator (``eval_shapes.eval_resize``; r is its gain h' / h).
        """
        if self.image_cache is not None:
            rec = self.records[index]
            shape = resized_shape if self.augment else eval_resized_shape
            return self.image_cache[index], shape(rec.height, rec.width, self.image_size, self.scaleup)[2]
        hit = self._decoded.get(index)
        if hit is not None:
            self._decoded.move_to_end(index)
            return hit
        rec = self.records[index]
        known = self._unreadable.get(index) if self.augment else None  # evaluation: always read again
        if known is not None:
            raise ImageReadError(rec.path, known)
        try:
            # The record's size first (a record from elsewhere, or a cache of a higher limit), then the file's
            # header when it is read (the file may have changed since).
            check_pixels(rec.path, rec.height, rec.width, self.max_image_pixels)
            read = self._read if self.image_bytes is None else partial(self._read_member, index)
            image, f = read(rec.path, rec.height, rec.width)
            if image.shape[:2] != (-(-rec.height // f), -(-rec.width // f)):
                raise ImageReadError(
                    rec.path,
                    f"decoded size {image.shape[:2]} differs from the record's ({rec.height}, {rec.width}); "
                    "the file changed since the label cache was built",
                )
        except ImageReadError as e:
            self._unreadable[index] = e.reason
            raise
        item = self.fit_decoded(image, rec.height, rec.width, f)
        if self.decode_cache_size > 0:
            self._decoded[index] = item
            if len(self._decoded) > self.decode_cache_size:
                self._decoded.popitem(last=False)
        return item

    def fit_decoded(self, image: np.ndarray, height: int, width: int, f: int) -> tuple[np.ndarray, float]:
        """A decoded image (of the record's (height, width), decoded at 1/f) as ``load_resized`` returns it: long
        side ``image_size`` (training, ``_resize``), or as the reference validator resizes (evaluation)."""
        if self.augment:  # a reduced decode (f > 1) only happens in training
            return self._resize(image, height, width, f)
        return eval_resize(image, self.image_size, self.scaleup)

    def _read_member(self, index: int, member: str, height: int, width: int) -> tuple[np.ndarray, int]:
        """``_read`` of sample ``index`` from ``image_bytes`` (``member``: its record's path)."""
        assert self.image_bytes is not None
        data = self.image_bytes.read(index, member)
        long_side = self.image_size if self.augment and self.reduced_decode else None
        image = decode_image_bytes(
            self.image_bytes.name(index, member), data, long_side, self.max_image_pixels
        )
        f = (
            1
            if long_side is None or image.shape[:2] == (height, width)
            else decode_scale(height, width, long_side)
        )
        return image, f

    def _read(self, path: str, height: int, width: int) -> tuple[np.ndarray, int]:
        """Decode for ``load_resized``: the image and the factor f it was decoded smaller by.

        Training decodes a JPEG at least twice ``image_size`` at 1/2, 1/4 or 1/8 scale
        (``images.io.decode_scale``: libjpeg's DCT scaling), f = 1 otherwise. The size
        check then expects ceil(height / f) x ceil(width / f).
        """
        attempts, backoff, limit = self.read_attempts, self.retry_backoff_s, self.max_image_pixels
        if not (self.augment and self.reduced_decode):
            return read_image_retrying(path, attempts, backoff, max_pixels=limit), 1
        image = read_image_retrying(path, attempts, backoff, self.image_size, limit)
        return image, 1 if image.shape[:2] == (height, width) else decode_scale(
            height, width, self.image_size
        )

    def _resize(self, image: np.ndarray, height: int, width: int, f: int) -> tuple[np.ndarray, float]:
        """The record's (height, width) image, decoded at 1/f scale: resized to long side ``image_size``.

        Shape and scale r are those of ``resize_long_side`` on the full image (``resized_shape``). Pixel i
        of a 1/f decode covers full pixels [f i, f i + f) (the last one cut at the edge), so the resize
        factors are those of the full image times f, not the reduced shape's ratio to the target.
        """
        if f == 1:
            return resize_long_side(image, self.image_size, self.scaleup)
        new_h, new_w, r = resized_shape(height, width, self.image_size, self.scaleup)
        fx, fy = new_w * f / width, new_h * f / height
        if fx != 1.0 or fy != 1.0:
            image = cv2.resize(image, None, fx=fx, fy=fy, interpolation=cv2.INTER_LINEAR)
        return image[:new_h, :new_w], r

    def _load_labelled(self, index: int) -> Labelled:
        image, r = self.load_resized(index)
        rec = self.records[index]
        return Labelled(image, Instances.from_record(rec, rec.width * r, rec.height * r, self.label_fields))

    def _substituting_loader(
        self, epoch: int, substitutes: dict[int, int], unreadable: list[tuple[str, str]]
    ):
        """``_load_labelled`` that replaces an unreadable image by its first readable substitute.

        Records ``substitutes[index] = substitute`` and ``(path, reason)`` of every image it could not read.
        When ``MAX_SUBSTITUTE_TRIES`` candidates fail too, a blank image without labels stands in
        (``BLANK_SUBSTITUTE``).
        """

        def load(index: int) -> Labelled:
            try:
                return self._load_labelled(index)
            except ImageReadError as e:
                unreadable.append((e.path, e.reason))
            for attempt in range(MAX_SUBSTITUTE_TRIES):
                candidate = substitute_index(self.seed, epoch, index, attempt, len(self))
                try:
                    sample = self._load_labelled(candidate)
                except ImageReadError as e:
                    unreadable.append((e.path, e.reason))
                    continue
                substitutes[index] = candidate
                return sample
            # Most of the data is gone. Raising here would end this rank alone (the others would wait in
            # their next collective): a blank sample instead, counted like a substitute, lets the
            # substitution limit stop every rank together.
            substitutes[index] = BLANK_SUBSTITUTE
            rec = self.records[index]
            height, width, _ = resized_shape(rec.height, rec.width, self.image_size, self.scaleup)
            blank = np.full((height, width, 3), 114, np.uint8)
            return Labelled(blank, Instances.empty(self.label_fields))

        return load
