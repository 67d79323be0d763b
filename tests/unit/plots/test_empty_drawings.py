"""Every task's drawing hooks on images with nothing to draw: no detection, no label, no keypoint.

The pose hooks raised ``ValueError: cannot reshape array of size 0 into shape (0,newaxis,3)`` on a training
batch image without people and on every validation image where nothing was detected, so the result pictures
and validation images of a pose run were lost. Each hook gets a batch of two images, the first with nothing
and the second with one label, and empty detections, as training, validation and predict hand them over.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from yolo11_lightning.tasks import TASKS, get_task
from yolo11_lightning.tasks.pose.drawing import draw_keypoints

SIZE, K = 64, 17
NAMES = ["a", "b"]


def _batch(task: str) -> dict[str, Any]:
    """Two images; one label on the second (a box, a rotated box, a person without visible keypoints, a
    mask), none on the first."""
    row = [1.0, 1.0, 0.5, 0.5, 0.25, 0.25] + ([math.pi / 6] if task == "obb" else [])
    batch: dict[str, Any] = {
        "images": torch.zeros(2, 3, SIZE, SIZE, dtype=torch.uint8),
        "targets": torch.tensor([row]),
        "labels": torch.tensor([0, 1]),
        "keypoints": torch.zeros(1, K, 3),  # labelled, all invisible
        "masks": torch.zeros(2, SIZE // 4, SIZE // 4, dtype=torch.uint8),
        "mask_overlap": True,
    }
    batch["masks"][1, 4:12, 4:12] = 1
    return batch


def _outputs(task: str) -> dict[str, Any]:
    """``Task.evaluate``'s result with no detection in either image."""
    columns = 7 if task == "obb" else 6
    return {
        "detections": [torch.zeros(0, columns)] * 2,
        "keypoints": [torch.zeros(0, K, 3)] * 2,
        "masks": [torch.zeros(0, SIZE // 4, SIZE // 4, dtype=torch.bool)] * 2,
        "probabilities": torch.full((2, len(NAMES)), 0.5),
    }


def _prediction(task: str) -> dict[str, Any] | torch.Tensor:
    """``Task.predict``'s result for one image with nothing detected."""
    empty = torch.zeros(0, 6)
    return {
        "detect": empty,
        "segment": {"detections": empty, "masks": torch.zeros(0, SIZE, SIZE, dtype=torch.bool)},
        "pose": {"detections": empty, "keypoints": torch.zeros(0, K, 3)},
        "obb": {"detections": empty, "rboxes": torch.zeros(0, 5)},
        "classify": {"probabilities": torch.full((len(NAMES),), 0.5), "names": NAMES},
    }[task]


@pytest.mark.parametrize("name", list(TASKS))
def test_every_drawing_hook_draws_an_image_with_nothing_on_it(name: str) -> None:
    task = get_task(name)
    batch, outputs = _batch(name), _outputs(name)
    images = batch["images"].permute(0, 2, 3, 1).numpy()
    for i, image in enumerate(images):  # the training batches of the result pictures
        assert task.draw_targets(image, batch, i, NAMES).shape == image.shape
    for i, image in enumerate(images):  # the validation images
        image = task.draw_ground_truth(image, batch, i)
        keep = outputs["detections"][i][:, 4] >= 0.25
        assert task.draw_evaluated(image, outputs, i, keep, NAMES).shape == image.shape
    detections, extras = task.split_result(_prediction(name))  # an annotated copy from predict
    original = np.zeros((48, 80, 3), np.uint8)
    drawn = task.draw_prediction(original, detections.numpy(), extras, NAMES, 1)
    assert drawn.shape == original.shape


@pytest.mark.parametrize("shape", [(0, K, 3), (0, 5, 2), (2, 0, 3), (0,)])
def test_no_person_or_no_keypoint_draws_nothing(shape: tuple[int, ...]) -> None:
    image = np.full((SIZE, SIZE, 3), 7, np.uint8)
    drawn = draw_keypoints(image, np.zeros(shape), np.zeros(shape[:1]))
    assert np.array_equal(drawn, image) and drawn is not image
