"""``YOLODataModule``: dataset yaml (or the synthetic dataset) -> train/val/test/predict DataLoaders.

Every ``__init__`` argument is a plain typed value, so LightningCLI exposes each as ``--data.<name>``.
``batch_size`` is the GLOBAL batch over all devices and nodes; each device loads
``batch_size / world_size`` (checked in ``setup``). The train order is defined globally by
``ElasticDistributedSampler`` and its position is saved in checkpoints (``state_dict``), so a run can
resume mid-epoch on any number of devices (``data.sampling.checkpoint``). The DataLoader workers are set up
by ``data.loader_workers``. The task (``tasks.get_task(task)``) gives the labels' instance fields, the collate
and the check of the records; left unset, it follows the model the data is trained with (``tasks.resolution``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from pathlib import Path
from typing import Literal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader

from yolo11_lightning.data.agreement import check_ranks_agree
from yolo11_lightning.data.augment.pipeline import AugmentConfig
from yolo11_lightning.data.build_once import run_once_per_node
from yolo11_lightning.data.cpu_cores import cores_per_rank
from yolo11_lightning.data.dataset import BoxDataset
from yolo11_lightning.data.image_dataset import ImageDataset
from yolo11_lightning.data.images.disk_cache import attach_disk_caches
from yolo11_lightning.data.images.limits import DEFAULT_MAX_IMAGE_PIXELS, pixel_limit
from yolo11_lightning.data.images.node_cache import RankGroup, attach_image_caches
from yolo11_lightning.data.loader_workers import auto_num_workers
from yolo11_lightning.data.sampling.checkpoint import TrainSamplerCheckpoint
from yolo11_lightning.data.sampling.partner_pools import dataset_options as partner_options
from yolo11_lightning.data.sampling.sampler import ElasticDistributedSampler, ShardedEvalSampler
from yolo11_lightning.data.sampling.shard_windows import DEFAULT_SHARD_WINDOW, ShardWindows
from yolo11_lightning.data.shards.reader import (
    DEFAULT_CACHE_GB,
    is_shard_location,
    load_shard_split,
    open_index,
)
from yolo11_lightning.data.sources.config import DatasetConfig, DatasetError
from yolo11_lightning.data.sources.split import dataset_config, label_cache_locations, load_split, split_name
from yolo11_lightning.data.sources.task_hint import dataset_task
from yolo11_lightning.errors import UserInputError
from yolo11_lightning.synthetic.poses import SYNTHETIC_KPT_SHAPE
from yolo11_lightning.synthetic.shapes import SYNTHETIC_YAML, make_synthetic_dataset, synthetic_class_names
from yolo11_lightning.tasks import get_task
from yolo11_lightning.tasks.resolution import TaskClaim, resolve_task, task_words
from yolo11_lightning.training.lightning_noise import trust_restored_sampler
from yolo11_lightning.training.loading.loaders import make_loader, on_accelerator
from yolo11_lightning.training.loading.options import check_data_options
from yolo11_lightning.training.loading.splits import check_stage_splits, split_of, stage_splits

log = logging.getLogger(__name__)

SYNTHETIC = "synthetic"


def dataset_task_claim(dataset: str) -> TaskClaim | None:
    """What a dataset's files say its task is (``data.sources.task_hint``), for ``tasks.resolution``; None when they
    do not say (the synthetic dataset is generated for the task the run chooses)."""
    hint = dataset_task(dataset) if dataset != SYNTHETIC else None
    if hint is None:
        return None
    return TaskClaim(
        hint.task, f"data.dataset={dataset!r} is a {task_words(hint.task)} dataset ({hint.evidence})"
    )


def dataset_kpt_shape(dataset: str, task: str) -> tuple[int, int] | None:
    """The keypoint shape (K, D) a run of ``task`` on ``dataset`` trains: the yaml's ``kpt_shape`` (the synthetic
    set's for "synthetic"); None for a task without keypoints (``Task.check_kpt_shape``) or a dataset without."""
    if get_task(task).check_kpt_shape(None) is None:
        return None
    return SYNTHETIC_KPT_SHAPE if dataset == SYNTHETIC else dataset_config(dataset).options.kpt_shape


class YOLODataModule(TrainSamplerCheckpoint, L.LightningDataModule):
    """Detection data for Lightning.

    Args:
        dataset: path of a dataset yaml, an ImageFolder root (classification: ``train/<class>/<images>``), a
            shard folder (``yolo11-lightning shard``'s output: a local folder or an fsspec url such as
            ``s3://bucket/prefix``), or "synthetic" to generate the built-in dataset of the task.
        batch_size: GLOBAL batch size over all devices and nodes (per device = batch_size / world_size).
        image_size: training and evaluation image side in pixels.
        num_workers: DataLoader worker processes per device, or ``"auto"`` (the GPU presets): each local rank's
            cores minus one (``data.loader_workers.auto_num_workers``), resolved in ``setup`` and logged.
        seed: seed of the data order and of the augmentation.
        pin_memory: page-locked batches for faster host-to-GPU copies (only when the batches go to an
            accelerator).
        persistent_workers: keep workers between epochs (only used when num_workers > 0).
        cache_images: keep decoded, resized images in RAM, one copy per node in ``/dev/shm`` shared by every
            local rank and worker (``data.images.node_cache``; refused when it would not fit); ``"disk"``: as
            ``.npy`` memory maps beside the label cache, decoded once and reused by later runs
            (``data.images.disk_cache``).
        mosaic .. hsv_v: augmentation hyper-parameters (``AugmentConfig``; reference defaults).
            ``scale_jitter`` is the reference's ``scale`` (random zoom gain), renamed so it cannot be
            confused with ``--model.scale`` (the network size) in merged hyper-parameters.
        mosaic_partners: where the 3 mosaic partners (and the mixup partner) of a training sample come from
            (``data.sampling.partner_pools``, measured in ``benchmarks/README.md``). ``"recent"`` (default): the
            sample's global batch and 3 earlier ones, 8 batches apart (64 images), decoded by its own worker
            already when ``num_workers`` divides 8. ``"dataset"``: any image, up to 4 decodes per sample
            without ``cache_images``, as accurate. ``"batch"``: its global batch only, cost accuracy on long
            runs. Every mode gives the same samples on any number of workers, ranks or restarts.
        close_mosaic: train the last ``close_mosaic`` epochs without mosaic/mixup (the reference's schedule;
            0: never). Resolved from ``trainer.max_epochs`` in ``setup``, before any worker starts, so
            persistent workers, every rank and a resumed run agree on it without messages.
        synthetic_dir: where "synthetic" is generated (reused when already there).
        synthetic_train, synthetic_val: number of synthetic images per split.
        synthetic_image_size: side of the synthetic images in pixels.
        synthetic_classes: number of synthetic classes (1-8).
        label_cache_dir: where label caches go when the dataset folder is read-only.
        prepare_data_per_node: generate the synthetic dataset once per node instead of once per job; needed
            only when nodes do not share its filesystem. Label caches need no setting: global rank 0 builds
            them, and a node that cannot read its cache builds its own (``build_once``).
        rect_val: validate and test in rectangular batches, the reference validator's default: images in
            aspect-ratio order, each global batch letterboxed to its own shape (``data.rect_batches``);
            False letterboxes every image to an ``image_size`` square. Training is always square.
        eval_box_gain: ``reference`` maps evaluation boxes back with the reference's one gain for both axes
            (its detections exactly); ``per_axis`` with each axis's own resize factor (``BoxDataset``).
        max_substituted_fraction: training images that cannot be read (deleted or corrupted during the run)
            are replaced by deterministic substitutes; when more than this share of the training set (at
            least 8 images) is replaced in one epoch, the run stops with an error (every rank together).
            1 disables the limit.
        max_image_pixels: an image of more pixels (width x height) is refused from its header before any
            decode, as an unreadable image: left out by the label check (named in the report) and, if it
            changed since, when read. Default 178,956,970, the reference's (PIL's decompression-bomb limit);
            0 or null: no limit.
        task: a task of ``tasks.TASKS``: "detect" (``DetectionBatch``es) or "segment" (``SegmentationBatch``es: instance masks at 1/4
            resolution from the polygons; "synthetic" then generates the segmentation set). None (default):
            the task of the model the data is trained with (read from the trainer's LightningModule in
            ``prepare_data`` / ``setup``), else the task the dataset's files say (a ``kpt_shape`` yaml: pose;
            its model's ``kpt_shape`` must be the yaml's), else detection (``tasks.resolution``). A given task must agree with both.
            ``task`` holds the resolved one once known, and so do the hyper-parameters.
        mask_overlap: segment task: masks as one index map per image (the reference's default) or, with
            False, one 0/1 mask per instance.
        auto_augment, erasing: classification's training augmentation (the reference's names and defaults):
            ``randaugment``, ``autoaugment``, ``augmix`` or null (then a colour jitter from ``hsv_*``), and the
            random-erasing probability. Classification also reads ``scale_jitter`` (crops of ``1 - scale_jitter``
            to all of the image's area), ``fliplr``, ``flipud``; not the mosaic and affine settings.
        shard_cache_dir: for a shard folder (``dataset`` a url such as ``s3://bucket/prefix``, or a local folder
            of ``yolo11-lightning shard``'s output): where each node keeps the shards it fetched
            (``<shard_cache_dir>/shards/<hash of the url>``; default ``~/.cache/yolo11_lightning``).
        shard_cache_gb: the most that folder holds; the least recently used shards go first.
        shard_window: a shard folder's training order (``data.sampling.shard_windows``): shards shuffled, then
            the samples of each ``shard_window`` consecutive shards shuffled together, so the ranks read few
            shards at a time; 0: a permutation of all samples, as for folders. A resume must keep it.
    """

    def __init__(
        self,
        dataset: str = SYNTHETIC,
        batch_size: int = 16,
        image_size: int = 640,
        num_workers: int | Literal["auto"] = 2,
        seed: int = 0,
        pin_memory: bool = True,
        persistent_workers: bool = True,
        cache_images: bool | Literal["disk"] = False,
        mosaic: float = 1.0,
        mixup: float = 0.0,
        mosaic_partners: Literal["recent", "dataset", "batch"] = "recent",
        close_mosaic: int = 10,
        degrees: float = 0.0,
        translate: float = 0.1,
        scale_jitter: float = 0.5,
        shear: float = 0.0,
        perspective: float = 0.0,
        fliplr: float = 0.5,
        flipud: float = 0.0,
        hsv_h: float = 0.015,
        hsv_s: float = 0.7,
        hsv_v: float = 0.4,
        synthetic_dir: str = "datasets/synthetic",
        synthetic_train: int = 64,
        synthetic_val: int = 16,
        synthetic_image_size: int = 128,
        synthetic_classes: int = 3,
        label_cache_dir: str | None = None,
        prepare_data_per_node: bool = False,
        max_substituted_fraction: float = 0.01,
        max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
        rect_val: bool = True,
        eval_box_gain: str = "reference",
        task: str | None = None,
        mask_overlap: bool = True,
        auto_augment: str | None = "randaugment",
        erasing: float = 0.4,
        shard_cache_dir: str | None = None,
        shard_cache_gb: float = DEFAULT_CACHE_GB,
        shard_window: int = DEFAULT_SHARD_WINDOW,
    ) -> None:
        super().__init__()
        if task is not None:
            get_task(task)  # a clear error naming the known tasks
        check_data_options(
            batch_size, image_size, num_workers, cache_images, mosaic_partners, max_substituted_fraction
        )
        # Paths as strings: checkpoints hold the hyper-parameters, and their guarded reader takes plain data only.
        dataset, synthetic_dir, label_cache_dir = (
            os.fspath(p) if isinstance(p, os.PathLike) else p
            for p in (dataset, synthetic_dir, label_cache_dir)
        )
        self.save_hyperparameters()
        self.dataset = dataset
        self.batch_size = batch_size
        self.image_size = image_size
        self.num_workers = num_workers  # an int once `setup` resolved "auto"
        self.seed = seed
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.cache_images = cache_images
        self.close_mosaic = close_mosaic
        self.mosaic_partners = mosaic_partners
        self.aug = AugmentConfig(
            mosaic=mosaic,
            mixup=mixup,
            degrees=degrees,
            translate=translate,
            scale=scale_jitter,
            shear=shear,
            perspective=perspective,
            fliplr=fliplr,
            flipud=flipud,
            hsv_h=hsv_h,
            hsv_s=hsv_s,
            hsv_v=hsv_v,
        )
        self.synthetic_dir = synthetic_dir
        self.mask_overlap = mask_overlap
        self.image_options = {"aug": self.aug, "auto_augment": auto_augment, "erasing": erasing}
        self.synthetic_options = {
            "num_train": synthetic_train,
            "num_val": synthetic_val,
            "image_size": synthetic_image_size,
            "num_classes": synthetic_classes,
            "task": task,
        }
        # The task: given, or what the dataset's files say (before the yaml is read: an ImageFolder root has
        # none), or left to `prepare_data` / `setup`, which read the model's (`resolve_task`).
        self.given_task = task
        self.task: str | None = None
        self.task_spec = None
        self.dataset_claim = dataset_task_claim(dataset)
        if task is not None or self.dataset_claim is not None:
            self._set_task(resolve_task(self._named_tasks(), dataset=self.dataset_claim))
        self.label_cache_dir = label_cache_dir
        if shard_cache_gb <= 0:
            raise UserInputError(f"data.shard_cache_gb must be positive, got {shard_cache_gb}")
        if shard_window < 0:
            raise UserInputError(
                f"data.shard_window must be >= 0 (0: shuffle all samples), got {shard_window}"
            )
        self.shard_cache_dir, self.shard_cache_gb, self.shard_window = (
            shard_cache_dir,
            shard_cache_gb,
            shard_window,
        )
        if cache_images == "disk" and dataset != SYNTHETIC and is_shard_location(dataset):
            raise UserInputError(
                f"{dataset}: data.cache_images=disk keeps images beside a dataset folder; a shard folder's stay "
                "in the node-local shard cache (true: the RAM cache)"
            )
        self.prepare_data_per_node = prepare_data_per_node
        self.max_substituted_fraction = max_substituted_fraction
        self.max_image_pixels = pixel_limit(max_image_pixels)  # None: no limit; raises for a negative one
        self.rect_val = rect_val
        self.eval_box_gain = eval_box_gain
        # LightningCLI links these into the model at instantiation: read only the yaml here.
        if dataset == SYNTHETIC:
            self.class_names = synthetic_class_names(synthetic_classes)
        else:
            self.class_names = list(dataset_config(dataset).names)
            if not self.class_names:
                raise DatasetError(f"{dataset}: no class names (`names`, or categories of a COCO json)")
        self.datasets: dict[str, BoxDataset] = {}
        self.mosaic_until_epoch: int | None = None
        self._train_sampler: ElasticDistributedSampler | None = None
        self._train_loader: DataLoader | None = None
        self._pending_sampler_state: dict[str, int] | None = None

    # ------------------------------------------------------------------------------------ properties
    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def num_train_samples(self) -> int | None:
        """Images in the training split once ``setup("fit")`` ran (``optimizer: auto`` decides from it)."""
        train = self.datasets.get("train")
        return len(train) if train is not None else None

    @property
    def yaml_path(self) -> Path:
        return Path(self.synthetic_dir) / SYNTHETIC_YAML if self.dataset == SYNTHETIC else Path(self.dataset)

    @property
    def world_size(self) -> int:
        return int(getattr(self.trainer, "world_size", 1)) if self.trainer is not None else 1

    @property
    def global_rank(self) -> int:
        return int(getattr(self.trainer, "global_rank", 0)) if self.trainer is not None else 0

    @property
    def per_device_batch_size(self) -> int:
        """``batch_size / world_size``; raises a clear error when it does not divide."""
        world = self.world_size
        if self.batch_size % world:
            raise UserInputError(
                f"data.batch_size={self.batch_size} is the GLOBAL batch over all devices and nodes and must "
                f"divide by the world size {world}; use e.g. {max(world, self.batch_size // world * world)}"
            )
        return self.batch_size // world

    # ------------------------------------------------------------------------------------ task
    def _named_tasks(self, model_task: str | None = None) -> list[TaskClaim]:
        named = [TaskClaim(self.given_task, f"data.task={self.given_task!r}")] if self.given_task else []
        if model_task is not None:
            named.append(TaskClaim(model_task, f"model.task={model_task!r} (the model trained on the data)"))
        return named

    def model_task(self) -> str | None:
        """The task of the LightningModule the trainer runs with this data, if it tells (``task``, a ``Task``
        or its name, or ``hparams["task"]``)."""
        module = getattr(self.trainer, "lightning_module", None) if self.trainer is not None else None
        task = getattr(module, "task", None)
        task = getattr(task, "name", task)
        if not isinstance(task, str):
            task = dict(getattr(module, "hparams", None) or {}).get("task")
        return task if isinstance(task, str) else None

    def resolve_task(self) -> str:
        """Settle the data's task (``task`` argument): the given one, else the model's, else the dataset's, else
        detection; TaskError names two sources that disagree. Datasets built for another task are dropped."""
        task = resolve_task(self._named_tasks(self.model_task()), dataset=self.dataset_claim)
        if task != self.task:
            # Set up for another task before (e.g. used alone, then with a segmentation model): built again.
            if self.datasets:
                self.datasets, self._train_loader = {}, None
            self._set_task(task)
        return task

    def _set_task(self, task: str) -> None:
        self.task, self.task_spec = task, get_task(task)
        self.synthetic_options["task"] = task
        # Checkpoints, run identities and the logged hyper-parameters hold the resolved task, never None.
        self.hparams["task"] = task
        initial = getattr(self, "_hparams_initial", None)  # Lightning's copy for the loggers
        if initial is not None:
            initial["task"] = task

    # ------------------------------------------------------------------------------------ splits
    def defined_splits(self) -> list[str]:
        """The splits the dataset defines (the synthetic dataset: train and val, before it is generated)."""
        if self.dataset == SYNTHETIC and not self.yaml_path.is_file():
            return ["train", "val"]
        config = self._config()
        return [s for s in ("train", "val", "test") if config.splits.get(s)]

    def check_splits(self, stage: str | None) -> None:
        """Raise MissingSplitError when the dataset lacks a split ``stage`` evaluates or trains on (fit: train
        and val; validate: val; test: test; predict: test, else val), naming the splits it has and what to do.

        An error, not a fall-back: numbers reported as test results must come from the test split. Reads only
        the yaml, so the CLI calls it before any process starts; ``setup`` calls it too (Python use).
        """
        check_stage_splits(stage, self.defined_splits(), str(self.yaml_path))

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the train sampler's position (``TrainSamplerCheckpoint``): a resume inside an epoch continues
        the order exactly, so Lightning's warning that it may not is silenced."""
        super().load_state_dict(state_dict)
        if "train_sampler" in state_dict:
            trust_restored_sampler()

    # ------------------------------------------------------------------------------------ data
    def prepare_data(self) -> None:
        """Settle the task and generate the synthetic dataset if asked. The label caches are built in ``setup``:
        by global rank 0 while the other ranks wait without a timeout (``build_once``)."""
        self.resolve_task()
        if self.dataset == SYNTHETIC:
            # The generator's own default seed, not `seed`: runs with other seeds compare on the same data.
            make_synthetic_dataset(self.synthetic_dir, **self.synthetic_options)

    def _config(self) -> DatasetConfig:
        config = dataset_config(self.yaml_path if self.dataset == SYNTHETIC else self.dataset)
        if config.names != self.class_names:
            raise DatasetError(f"{self.yaml_path}: class names changed since the DataModule was created")
        return config

    def _make_dataset(
        self, config: DatasetConfig, split: str, augment: bool, evaluated: bool = False
    ) -> BoxDataset:
        """The dataset of ``split``: training (``augment``) or evaluation (``evaluated``; False: prediction)."""
        images = None
        if config.shards is not None:  # the records as converted; images from the node-local shard cache
            records, images = load_shard_split(
                open_index(config.shards), split, self.shard_cache_dir, self.shard_cache_gb
            )
        else:
            records, _ = run_once_per_node(
                RankGroup.from_trainer(self.trainer),
                f"the `{split}` labels of {config.source}",
                lambda: load_split(
                    config,
                    split,
                    cache_dir=self.label_cache_dir,
                    verbose=self.global_rank == 0,
                    max_image_pixels=self.max_image_pixels,
                ),
            )
        self._check_kpt_shape(config)
        refusal = self.task_spec.check_split(records, config.names, evaluated)
        if refusal is not None:  # every rank: the records agree, so every rank stops here alike
            raise DatasetError(f"{split_name(config, split)}: {refusal}")
        if self.global_rank == 0:
            self.task_spec.check_records(records, f"{config.source} `{split}`")
            if augment:
                self._hint_keypoints(config)
        partners = (
            partner_options(
                self.mosaic_partners, self.batch_size, self.per_device_batch_size, self.num_workers
            )
            if augment
            else {}
        )
        aug = self.aug
        keypoints = config.options.kpt_shape is not None and self.task_spec.check_kpt_shape(None) is not None
        if keypoints and config.options.flip_idx is None and (aug.fliplr or aug.flipud):
            # A mirrored image's keypoints need their permutation: without one the reference drops the flips.
            rank_zero_warn(f"{config.source}: no `flip_idx` for its keypoints: fliplr and flipud are off")
            aug = dataclasses.replace(aug, fliplr=0.0, flipud=0.0)
        whole = {"task_options": self.image_options} if self.task_spec.whole_image else {}
        dataset = (ImageDataset if whole else BoxDataset)(
            records,
            self.image_size,
            augment=augment,
            aug=aug,
            seed=self.seed,
            mosaic_until_epoch=self.mosaic_until_epoch if augment else None,
            **partners,
            eval_box_gain=self.eval_box_gain,
            task=self.task_spec,
            mask_overlap=self.mask_overlap,
            max_image_pixels=self.max_image_pixels,
            image_bytes=images,
            shard_windows=ShardWindows(images.shard, self.shard_window)
            if images is not None and augment and self.shard_window
            else None,
            **whole,
        )
        return dataset

    def _hint_keypoints(self, config: DatasetConfig) -> None:
        """Say so when the labels carry keypoints this task leaves out (a COCO keypoints json trained as boxes:
        its categories declare keypoints, which makes it a box dataset too, so the task stays the user's)."""
        if config.options.kpt_shape is not None and self.task_spec.check_kpt_shape(None) is None:
            rank_zero_info(
                f"{config.source}: its labels carry keypoints (kpt_shape {list(config.options.kpt_shape)}), which a "
                f"{task_words(self.task)} run leaves out; --model.task pose trains them"
            )

    def _check_kpt_shape(self, config: DatasetConfig) -> None:
        """A model with keypoints trains on a dataset of the same ``kpt_shape`` (DatasetError, one line)."""
        module = getattr(self.trainer, "lightning_module", None) if self.trainer is not None else None
        model_shape = getattr(getattr(module, "model", None), "kpt_shape", None)
        if self.task_spec.check_kpt_shape(None) is None or model_shape is None:
            return
        if config.options.kpt_shape is None or tuple(config.options.kpt_shape) != tuple(model_shape):
            found = (
                f"kpt_shape {list(config.options.kpt_shape)}"
                if config.options.kpt_shape is not None
                else "no kpt_shape (no key `kpt_shape`, no keypoint names in a COCO json's categories)"
            )
            raise DatasetError(
                f"{config.source}: the dataset has {found} but the model's kpt_shape is {list(model_shape)}: "
                "train a model of the dataset's kpt_shape"
            )

    def setup(self, stage: str | None = None) -> None:
        """Check the batch split over devices, load the records of the splits ``stage`` needs, and check
        that every rank loaded the same data (``agreement``; all ranks fail together when not); then, with
        ``cache_images``, build the image cache of the new splits (one copy per node, ``node_cache``).
        First, on every rank alike: the task (``resolve_task``) and the splits ``stage`` needs (``check_splits``)."""
        self.per_device_batch_size  # noqa: B018 -- raises early when the global batch does not divide
        self.resolve_task()
        self.check_splits(stage if stage in ("fit", "validate", "test", "predict") else "fit")
        if self.num_workers == "auto":  # before the datasets: the "recent" decode cache is sized by it
            local_ranks = int(getattr(self.trainer, "num_devices", 1)) if self.trainer is not None else 1
            cores, counted = cores_per_rank(local_ranks)
            decode_once = self.mosaic_partners == "recent" and not self.cache_images
            self.num_workers, how = auto_num_workers(cores, decode_once)
            rank_zero_info(f"num_workers auto: {self.num_workers} per device ({counted}; {how})")
        error: BaseException | None = None
        created: list[str] = []
        try:
            created = self._load_splits(stage)
            if stage in ("fit", None):
                self._resolve_close_mosaic()
        except Exception as e:  # any error: re-raised once the other ranks have been told
            error = e
        strategy = getattr(self.trainer, "strategy", None) if self.trainer is not None else None
        if strategy is None:
            if error is not None:
                raise error
        else:
            check_ranks_agree(self.datasets, strategy, error)
        if self.cache_images and created:
            group, datasets = RankGroup.from_trainer(self.trainer), [self.datasets[k] for k in created]
            if self.cache_images == "disk":
                config = self._config()
                splits = [split_of(k, bool(config.splits.get("test"))) for k in created]
                locations = [label_cache_locations(config, s, self.label_cache_dir) for s in splits]
                attach_disk_caches(datasets, locations, group)
            else:
                attach_image_caches(datasets, group)

    def _load_splits(self, stage: str | None) -> list[str]:
        """Create the datasets ``stage`` needs that do not exist yet; returns their keys."""
        config = dataclasses.replace(self._config(), outline_labels=self.task_spec.outline_labels)
        splits = stage_splits(stage, bool(config.splits.get("test")))
        created = []
        for split, augment in splits:
            key = "predict" if stage == "predict" else split
            if key not in self.datasets:
                self.datasets[key] = self._make_dataset(
                    config, split, augment, not augment and key != "predict"
                )
                created.append(key)
        return created

    # ------------------------------------------------------------------------------------ loaders
    def _loader(self, dataset: BoxDataset, sampler, batch_size: int) -> DataLoader:
        """A DataLoader of this module's worker and memory settings and the task's collate."""
        return make_loader(
            dataset,
            sampler,
            batch_size,
            self.num_workers,
            self.pin_memory and on_accelerator(self.trainer),
            self.persistent_workers,
            self.task_spec.collate,
        )

    def train_dataloader(self) -> DataLoader:
        dataset = self.datasets["train"]
        sampler = ElasticDistributedSampler(
            dataset,
            self.batch_size,
            num_replicas=self.world_size,
            rank=self.global_rank,
            seed=self.seed,
            windows=dataset.shard_windows,
        )
        if self._pending_sampler_state is not None:
            sampler.load_state_dict(self._pending_sampler_state)
            self._pending_sampler_state = None
        elif self._train_sampler is not None:  # loaders re-created (reload_dataloaders_every_n_epochs)
            sampler.load_state_dict(self._train_sampler.state_dict())
        self._train_sampler = sampler
        self._train_loader = self._loader(dataset, sampler, self.per_device_batch_size)
        return self._train_loader

    def _eval_loader(self, key: str) -> DataLoader:
        dataset = self.datasets[key]
        # Rectangular groups of the global batch: the same shapes on any world size (sampler docstring).
        order = dataset.set_rect_batches(self.batch_size) if self.rect_val and key != "predict" else None
        sampler = ShardedEvalSampler(
            dataset, num_replicas=self.world_size, rank=self.global_rank, order=order
        )
        return self._loader(dataset, sampler, self.per_device_batch_size)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def predict_dataloader(self) -> DataLoader:
        """The test split when the dataset has one, else val; letterboxed like evaluation."""
        return self._eval_loader("predict")

    # ------------------------------------------------------------------------------------ schedule
    def _resolve_close_mosaic(self) -> None:
        """Mosaic/mixup off from epoch ``max_epochs - close_mosaic`` (never with ``close_mosaic <= 0`` or no
        epoch limit)."""
        max_epochs = getattr(self.trainer, "max_epochs", None) if self.trainer is not None else None
        if self.close_mosaic <= 0 or not max_epochs or max_epochs < 0:
            return
        self.set_close_mosaic_epoch(max(max_epochs - self.close_mosaic, 0))

    def set_close_mosaic_epoch(self, epoch: int | None) -> None:
        """Train without mosaic/mixup from ``epoch`` on (None: never). Call before the workers start."""
        self.mosaic_until_epoch = epoch
        if "train" in self.datasets:
            self.datasets["train"].mosaic_until_epoch = epoch
        if self._train_loader is not None and getattr(self._train_loader, "_iterator", None) is not None:
            warnings.warn(
                "set_close_mosaic_epoch was called after the train DataLoader's workers started; persistent "
                "workers keep their own copy of the dataset and will not see it. Call it in setup/on_fit_start.",
                stacklevel=2,
            )
