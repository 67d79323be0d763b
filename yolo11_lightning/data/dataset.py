"""The detection Dataset: records -> augmented, letterboxed samples.

``BoxDataset[i]`` (or ``[(epoch, i)]``) returns one sample dict (``image`` (3, H, W) uint8, ``labels``
(n, 5) ``[class, cx, cy, w, h]`` normalised, ``index``, ``orig_size``, ``scale``, ``pad``, ``path`` and the
unreadable-image fields); the task's collate (``Task.collate``, ``structures.batch.collate_detection`` for detection)
stacks samples into the batch contract (``structures.batch.DetectionBatch``, shapes and units there).
``RecordImageLoader`` (``data.images.loading``) holds the dataset's image loading (``load_resized``).

The labels travel as ``structures.instances.Instances`` with the task's instance fields (``Task.label_fields``;
a segmentation sample's outlines, ``structures.polygons.Polygons``), moved by augmentation or letterbox with the
boxes. The task then turns them into what its samples add (``Task.sample_targets``): a segmentation sample its
``masks`` (``tasks.segment.masks.rasterize`` at 1/4 of the image side), with the ``labels`` rows in the order the
masks refer to.

Instances without a polygon in a segment dataset (box rows of a YOLO-seg file, COCO annotations without
``segmentation``, polygons dropped by the checks) get their box's rectangle as outline
(``polygons.with_box_outlines``); the DataModule logs their count (``Task.check_records``). The reference instead
warns and removes every polygon of the dataset when box and polygon counts differ (``YOLODataset.
get_labels``); its mask formatting then drops every label of every image (``Format._format_segments``
indexes the instances by the order of zero masks), so a mixed dataset would train on nothing. Boxes as
masks keep all boxes and every real polygon.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from yolo11_lightning.data.augment.pipeline import AugmentConfig, augment_train_sample
from yolo11_lightning.data.augment.transforms import letterbox
from yolo11_lightning.data.images.cache import ImageCache, resized_shape
from yolo11_lightning.data.images.limits import DEFAULT_MAX_IMAGE_PIXELS, ImageReadError, pixel_limit
from yolo11_lightning.data.images.loading import ImageBytes, RecordImageLoader
from yolo11_lightning.data.rect_batches import eval_resized_shape, rect_batches
from yolo11_lightning.data.sampling.partner_pools import (
    RECENT_BATCHES,
    pool_positions,
    recent_decode_cache_size,
)
from yolo11_lightning.data.sampling.sampler import epoch_order
from yolo11_lightning.data.sampling.seeds import partner_stride, sample_rng
from yolo11_lightning.data.sampling.shard_windows import ShardWindows
from yolo11_lightning.data.sources.packed_records import PackedRecords
from yolo11_lightning.data.task_samples import TaskSamples
from yolo11_lightning.structures.batch import image_tensor
from yolo11_lightning.structures.boxes import xywhn_to_xyxy, xyxy_to_xywhn
from yolo11_lightning.structures.instances import Instances
from yolo11_lightning.structures.records import ImageRecord

log = logging.getLogger(__name__)
PREFETCH_SAMPLES = (
    256  # positions of the epoch's order ahead of a training sample whose shards are fetched ahead
)


DETECTION = TaskSamples()  # detection's samples: boxes and classes


class BoxDataset(RecordImageLoader, Dataset):
    """Images and boxes from ``ImageRecord``s, augmented for training or letterboxed for evaluation.

    ``dataset[(epoch, index)]`` (what ``ElasticDistributedSampler`` yields) or ``dataset[index]`` (epoch 0)
    returns a dict: ``image`` uint8 (3, S, S) RGB, ``labels`` float32 (n, 5) ``[class, cx, cy, w, h]``
    normalised to the output image, ``index``, ``path``, ``orig_size`` (h, w), ``scale``, ``pad`` (left, top).

    Every image is first resized so its long side is ``image_size`` (the reference loads images this way
    for training and validation alike, enlarging small ones; ``scaleup=False`` keeps small ones as they
    are; evaluation rounds the short side as the reference validator does, ``data.rect_batches``).
    Evaluation then pads with grey 114 to a square ``image_size``, or, after ``set_rect_batches``, to the
    rectangle of the image's aspect-ratio group (the reference validator's default).

    Training augmentation is a pure function of ``(seed, epoch, index)``, whatever the number of workers,
    ranks or nodes.

    Images that cannot be read (deleted, truncated, a transient I/O error) are retried ``read_attempts``
    times with a short backoff; one above ``max_image_pixels`` (from the record's size or the file's header,
    before any decode) is unreadable at once. In training an image that still fails is replaced by a deterministic
    substitute (``substitute_index``; the augmentation stays that of the original sample), reported in the
    batch (``substitutes``, ``unreadable``); in evaluation the sample is marked missing and
    ``collate_detection`` leaves it out of the batch, so it is scored nowhere. The substitutes are the same
    for any number of workers, ranks and for a resumed run whenever the same files are unreadable from the
    start of the epoch (per-process memories of decoded and unreadable images are cleared at each epoch).

    Samples of epochs ``>= mosaic_until_epoch`` use letterbox + affine without mosaic and mixup (the
    reference's last-epochs "close mosaic"); set it before the DataLoader workers start.

    Args:
        records: the images and their labels.
        image_size: output side S in pixels (a multiple of 32 for the model).
        augment: training augmentation (True) or evaluation letterbox (False).
        aug: augmentation hyper-parameters (reference defaults when None).
        seed: seed of the augmentation (use the sampler's seed).
        mosaic_until_epoch: first epoch without mosaic/mixup; None keeps them on.
        scaleup: enlarge images smaller than ``image_size`` when loading.
        image_cache: decoded, resized images of all records (RAM), or None to read files.
        global_batch_size: the sampler's global batch B. Mosaic/mixup partners are then drawn from the
            sample's partner pool (``partner_pool``, ``data.sampling.partner_pools``): the samples of its global
            batch at positions congruent to its own modulo ``partner_stride(B)``, and with
            ``partner_batches`` > 1 those of as many earlier global batches, ``recent_spacing`` apart. On
            any world size dividing that stride the pool lies on the sample's own rank, in per-device
            batches its worker decodes anyway: about 1 decode per sample instead of 4. None draws
            partners from the whole dataset. Either way they are a function of (seed, epoch, index) only.
        partner_batches: global batches a pool spans: 1 (``mosaic_partners="batch"``) or
            ``RECENT_BATCHES`` (``"recent"``); only used with ``global_batch_size``.
        decode_cache_size: decoded images each worker keeps (LRU) for re-use as partners; 0 disables,
            None picks min(global_batch_size or 16, 128) for one-batch pools and
            ``recent_decode_cache_size(global_batch_size, 1)`` for longer ones (about 1 MB per 640 image).
        eval_box_gain: how evaluation maps boxes back to original pixels. ``"reference"`` (default): one
            gain, resized over original height, for both axes, as the reference validator does, so the
            detections equal its own (``data.rect_batches``); ``scale`` is then a float. ``"per_axis"``: each
            axis by the factor it was resized by (``scale`` = (x, y)), which the reference does not do: its
            x coordinates are off by up to one resized pixel over the image width, which costs COCO mAP at
            the high IoU thresholds on small images (``benchmarks/val_parity.py``).
        read_attempts: reads of an image before it counts as unreadable (>= 1).
        retry_backoff_s: first pause between reads, doubled after each failure.
        reduced_decode: in training, decode a JPEG at least twice ``image_size`` at 1/2, 1/4 or 1/8 scale
            (see ``_read``); False always decodes fully, as evaluation does.
        task: the run's task as the samples see it (``TaskSamples``; ``tasks.get_task(name)``), detection's by
            default (module docstring).
        mask_overlap: segment task: one index map per image (True, the reference's default) or one 0/1
            mask per instance (False).
        max_image_pixels: an image of more pixels is unreadable (``images.limits.ImageTooLargeError``, never
            decoded); default the reference's limit, None or 0: no limit.
        image_bytes: where the images' bytes come from when not from files at the records' paths (a shard
            folder's ``data.shards.reader.ShardImages``: the records' paths are then tar members).
        shard_windows: the train sampler's shard-aware order (``sampling.shard_windows``), which the partner
            pools follow; None: the order of all samples.
    """

    def __init__(
        self,
        records: Sequence[ImageRecord],
        image_size: int = 640,
        augment: bool = False,
        aug: AugmentConfig | None = None,
        seed: int = 0,
        mosaic_until_epoch: int | None = None,
        scaleup: bool = True,
        image_cache: ImageCache | None = None,
        global_batch_size: int | None = None,
        partner_batches: int = 1,
        decode_cache_size: int | None = None,
        read_attempts: int = 3,
        retry_backoff_s: float = 0.05,
        reduced_decode: bool = True,
        eval_box_gain: str = "reference",
        task: TaskSamples = DETECTION,
        mask_overlap: bool = True,
        max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
        image_bytes: ImageBytes | None = None,
        shard_windows: ShardWindows | None = None,
    ) -> None:
        self.task = task
        self.image_bytes = image_bytes
        self.shard_windows = shard_windows
        self.max_image_pixels = pixel_limit(max_image_pixels)  # None: no limit; raises for a negative one
        if image_size <= 0:
            raise ValueError(f"image_size must be positive, got {image_size}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if image_cache is not None and len(image_cache) != len(records):
            raise ValueError(
                f"image cache holds {len(image_cache)} images but there are {len(records)} records"
            )
        self.label_fields = self.task.label_fields
        self.target_options = {"mask_overlap": mask_overlap}
        polygons = any(f.reads_polygons for f in self.label_fields)
        if isinstance(records, PackedRecords):  # what load_split gives: kept as it is, no record built
            self.records = records if polygons else records.without_polygons()
        else:
            self.records = PackedRecords(records, polygons=polygons)
        self.image_size = image_size
        self.augment = augment
        self.aug = aug if aug is not None else AugmentConfig()
        self.seed = seed
        self.mosaic_until_epoch = mosaic_until_epoch
        self.scaleup = scaleup
        self.image_cache = image_cache
        if partner_batches not in (1, RECENT_BATCHES):
            raise ValueError(f"partner_batches must be 1 or {RECENT_BATCHES}, got {partner_batches}")
        self.global_batch_size = global_batch_size
        self.partner_batches = partner_batches
        if decode_cache_size is None:  # enough for the pools: a worker decodes each pool image once
            decode_cache_size = (
                min(global_batch_size or 16, 128)
                if partner_batches == 1 or global_batch_size is None
                else recent_decode_cache_size(global_batch_size, 1)
            )
        self.decode_cache_size = decode_cache_size if augment and image_cache is None else 0
        if read_attempts < 1:
            raise ValueError(f"read_attempts must be >= 1, got {read_attempts}")
        if eval_box_gain not in ("reference", "per_axis"):
            raise ValueError(f"eval_box_gain must be 'reference' or 'per_axis', got {eval_box_gain!r}")
        self.eval_box_gain = eval_box_gain
        self.read_attempts = read_attempts
        self.retry_backoff_s = retry_backoff_s
        self.reduced_decode = reduced_decode
        self._decoded: OrderedDict[int, tuple[np.ndarray, float]] = OrderedDict()
        # Training images this process found unreadable in epoch `_unreadable_epoch` (index -> reason): not
        # read again in that epoch (a file is retried in the next one, so a transient failure can heal).
        self._unreadable: dict[int, str] = {}
        self._unreadable_epoch = 0
        self._order_epoch: int | None = None
        self._order: np.ndarray = np.zeros(0, np.int64)
        self._position: np.ndarray = np.zeros(0, np.int64)
        # Rectangular evaluation (set_rect_batches): the aspect-ratio order and each index's batch shape.
        self.rect_order: np.ndarray | None = None
        self.batch_shapes: np.ndarray | None = None

    def set_rect_batches(self, batch_size: int) -> np.ndarray:
        """Letterbox each evaluation image to the shape of its aspect-ratio group of ``batch_size``.

        The sampler must then yield ``rect_order`` (``ShardedEvalSampler(order=...)``) in batches that divide
        ``batch_size``, so every batch lies in one group. Call before the DataLoader workers start.
        Returns ``rect_order``.
        """
        if self.augment:
            raise ValueError("rectangular batches are for evaluation; training letterboxes to squares")
        sizes = self.records._sizes
        self.rect_order, self.batch_shapes = rect_batches(
            sizes[:, 0], sizes[:, 1], batch_size, self.image_size
        )
        return self.rect_order

    def resized_shapes(self) -> np.ndarray:
        """(n, 2) int64 (h', w') of every ``load_resized`` image, without decoding (sizes an image cache)."""
        shape = resized_shape if self.augment else eval_resized_shape
        sizes = self.records._sizes
        return np.array(
            [shape(int(h), int(w), self.image_size, self.scaleup)[:2] for h, w in sizes], np.int64
        ).reshape(-1, 2)

    def __len__(self) -> int:
        return len(self.records)

    def __getstate__(self) -> dict[str, Any]:
        # Workers start with empty per-process caches instead of a pickled copy of the parent's.
        state = self.__dict__.copy()
        state["_decoded"] = OrderedDict()
        state["_order_epoch"] = None
        return state

    # ------------------------------------------------------------------------------------ partners
    def _epoch_order(self, epoch: int) -> None:
        """The sampler's order of ``epoch`` and each index's first position in it (once per epoch per worker)."""
        if self._order_epoch != epoch:
            self._order = epoch_order(
                len(self), self.seed, epoch, self.global_batch_size or 1, self.shard_windows
            )
            # Padding repeats a few indices at the end; their first position decides their pool.
            self._position = np.unique(self._order, return_index=True)[1]
            self._order_epoch = epoch

    def _prefetch(self, epoch: int, index: int) -> None:
        """Have the shards of the next ``PREFETCH_SAMPLES`` positions after this sample's fetched in the background
        (a shard folder's training split: every rank and worker of the node shares what is fetched)."""
        self._epoch_order(epoch)
        start = int(self._position[index]) + 1
        ahead = self._order[start : start + PREFETCH_SAMPLES]
        assert self.image_bytes is not None
        self.image_bytes.prefetch(epoch, np.unique(self.image_bytes.shard[ahead]))

    def partner_pool(self, epoch: int, index: int) -> np.ndarray | None:
        """Indices the mosaic/mixup partners of sample (epoch, index) are drawn from; None: any index.

        Positions q = p (mod stride) of the sample's global batch in the epoch's order (``epoch_order``),
        and of the earlier batches of a ``"recent"`` pool (``partner_pools.pool_positions``).
        """
        batch = self.global_batch_size
        if batch is None:
            return None
        stride = partner_stride(batch)
        if batch // stride < 4:  # too few to fill a mosaic with distinct images
            return None
        self._epoch_order(epoch)
        num_batches = len(self._order) // batch
        positions = pool_positions(
            int(self._position[index]), batch, stride, self.partner_batches, num_batches
        )
        return self._order[positions]

    def _picker(self, epoch: int, index: int):
        pool = self.partner_pool(epoch, index)
        n = len(self)

        def pick(rng: np.random.Generator, k: int) -> list[int]:
            if pool is None:
                return rng.integers(0, n, size=k).tolist()
            return rng.choice(pool, size=k, replace=False).tolist()

        return pick

    # ------------------------------------------------------------------------------------ samples
    def __getitem__(self, item: int | tuple[int, int]) -> dict[str, Any]:
        epoch, index = item if isinstance(item, tuple) else (0, item)
        index = int(index)
        if epoch != self._unreadable_epoch:  # what this process remembers is valid for one epoch
            self._unreadable, self._unreadable_epoch = {}, epoch
            self._decoded.clear()
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for a dataset of {len(self)} images")
        rec = self.records[index]
        size = self.image_size
        substitutes: dict[int, int] = {}
        unreadable: list[tuple[str, str]] = []
        if self.augment:
            if self.image_bytes is not None:
                self._prefetch(epoch, index)
            mix = self.mosaic_until_epoch is None or epoch < self.mosaic_until_epoch
            rng = sample_rng(self.seed, epoch, index)
            load = self._substituting_loader(epoch, substitutes, unreadable)
            image, instances = augment_train_sample(
                index, load, self._picker(epoch, index), rng, self.aug, size, mix
            )
            scale, pad = math.nan, (math.nan, math.nan)  # no single scale/pad maps an augmented image back
        else:
            try:
                resized, r = self.load_resized(index)
            except ImageReadError as e:
                return self._missing(index, e)
            shape = size if self.batch_shapes is None else tuple(int(v) for v in self.batch_shapes[index])
            image, r2, (left, top) = letterbox(resized, shape, scaleup=False)
            pad = (float(left), float(top))
            if self.eval_box_gain == "per_axis":  # the scale each axis was resized by
                scale = (resized.shape[1] / rec.width * r2, resized.shape[0] / rec.height * r2)
                gains = np.array([scale[0], scale[1], scale[0], scale[1]], np.float32)
            else:  # the reference's one gain, h' / h, for both axes
                scale = r * r2
                gains = np.float32(scale)
            # From original pixels with the batch's scale, so (xy - pad) / scale inverts it exactly.
            boxes = xywhn_to_xyxy(rec.boxes, rec.width, rec.height) * gains
            boxes += np.array([left, top, left, top], dtype=np.float32)
            # Fields on the image's own pixels: each axis by its resize factor, then the pad (the reference
            # validator's masks; the boxes keep the mapping ``eval_box_gain`` chose).
            width, height = resized.shape[1] * r2, resized.shape[0] * r2
            fields = {f.name: f.from_record(rec, width, height).placed(1, pad) for f in self.label_fields}
            instances = Instances(boxes, rec.classes, fields)
        order, targets = self.task.sample_targets(image.shape[:2], instances, self.target_options)
        boxes, classes = instances.boxes, instances.classes
        if order is not None:
            boxes, classes = boxes[order], classes[order]
        labels = np.concatenate(
            [classes.astype(np.float32)[:, None], xyxy_to_xywhn(boxes, image.shape[1], image.shape[0])],
            axis=1,
        )
        sample = {
            "image": image_tensor(image),
            "labels": torch.from_numpy(labels),
            "index": index,
            "path": rec.path,
            "orig_size": (rec.height, rec.width),
            "scale": scale,
            "pad": pad,
            "substitute": substitutes.get(index, -1),
            "unreadable": unreadable,
            "missing": False,
        }
        sample.update(targets)
        return sample

    def _missing(self, index: int, error: ImageReadError) -> dict[str, Any]:
        """The placeholder of an unreadable evaluation image: ``collate_detection`` drops it."""
        rec = self.records[index]
        return {
            "image": torch.zeros(3, 0, 0, dtype=torch.uint8),
            "labels": torch.zeros(0, 5),
            "index": index,
            "path": rec.path,
            "orig_size": (rec.height, rec.width),
            "scale": math.nan,
            "pad": (math.nan, math.nan),
            "substitute": -1,
            "unreadable": [(error.path, error.reason)],
            "missing": True,
            **self.task.missing_targets(self.target_options),
        }
