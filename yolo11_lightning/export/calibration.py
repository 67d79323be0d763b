"""Images of a dataset's training split, preprocessed as validation does, to calibrate an INT8 export.

``calibration_images(dataset, task, size, count)`` reads ``count`` images spread evenly over the split (every
image when it has fewer), letterboxes them to a square of ``size`` (a whole-image task: its own evaluation
transform) and returns them as float32 (N, 3, size, size) in [0, 1], the input an exported file takes.
Unreadable images are skipped; a split with no readable image is one line naming it. Imports the data layer
and, for the synthetic dataset, the DataModule that generates it (Lightning).
"""

from __future__ import annotations

import numpy as np

from yolo11_lightning.data.augment.transforms import letterbox
from yolo11_lightning.data.images.io import read_image
from yolo11_lightning.data.images.limits import ImageReadError
from yolo11_lightning.data.sources.split import dataset_config, load_split, split_name
from yolo11_lightning.errors import UserInputError
from yolo11_lightning.structures.batch import image_tensor
from yolo11_lightning.tasks import get_task
from yolo11_lightning.training.datamodule import YOLODataModule

__all__ = ["CALIBRATION_SPLIT", "CalibrationError", "calibration_images"]

CALIBRATION_SPLIT = "train"


class CalibrationError(UserInputError):
    """No image to calibrate on (one line naming the split)."""


def calibration_images(dataset: str, task: str, size: int, count: int = 64) -> np.ndarray:
    """Up to ``count`` training-split images of ``dataset`` (a yaml, a folder or ``synthetic``) as float32
    (N, 3, size, size) in [0, 1], preprocessed for ``task`` as validation does."""
    data = YOLODataModule(dataset, batch_size=1, image_size=size, num_workers=0, task=task)
    data.prepare_data()  # the synthetic dataset is generated here
    config = dataset_config(data.yaml_path)
    where = split_name(config, CALIBRATION_SPLIT)
    try:
        records, _ = load_split(config, CALIBRATION_SPLIT, cache_dir=data.label_cache_dir, verbose=False)
    except UserInputError as e:  # its report runs over several lines: the first problem is enough here
        raise CalibrationError(f"{where}: no readable image to calibrate INT8 on") from e
    spec = get_task(task)
    transform = spec.image_transform(False, size, {}) if spec.whole_image else None
    picks = np.unique(np.linspace(0, len(records) - 1, num=min(count, len(records))).round().astype(int))
    images = []
    for i in picks:
        try:
            rgb = read_image(records[int(i)].path)
        except ImageReadError:
            continue
        image = transform(rgb) if transform is not None else letterbox(rgb, size, scaleup=True)[0]
        images.append(image_tensor(image).float().div(255).numpy())
    if not images:
        raise CalibrationError(f"{where}: no readable image to calibrate INT8 on")
    return np.stack(images).astype(np.float32)
