"""Oriented boxes drawn as rotated outlines: the ground truth of the validation images (``ValidationImages`` through
``Task.draw_ground_truth``) and the annotated copies of ``predict`` (``PredictionWriter`` through
``Task.draw_prediction``), checked by their pixels on a box turned by 45 degrees."""

from __future__ import annotations

import math
import types
from pathlib import Path

import cv2
import numpy as np
import torch

from yolo11_lightning.predict.writer import PredictionWriter
from yolo11_lightning.tasks import get_task
from yolo11_lightning.tasks.obb.rotated import corners
from yolo11_lightning.training.callbacks.validation_images import ValidationImages


def _lit(image: np.ndarray, points) -> list[bool]:  # type: ignore[no-untyped-def]
    """Whether the pixel at each (x, y) of ``points`` (or one of its 8 neighbours) is drawn on a black image."""
    return [bool(image[round(y) - 1 : round(y) + 2, round(x) - 1 : round(x) + 2].any()) for x, y in points]


def _outline_points(box: torch.Tensor) -> list[tuple[float, float]]:
    """Points a quarter and three quarters along each side of an xywhr box (away from its corners and label)."""
    c = corners(box).tolist()
    return [
        (c[i][0] + t * (c[(i + 1) % 4][0] - c[i][0]), c[i][1] + t * (c[(i + 1) % 4][1] - c[i][1]))
        for i in range(4)
        for t in (0.25, 0.75)
    ]


def test_validation_images_draw_the_rotated_ground_truth(tmp_path: Path) -> None:
    """A 32 x 32 box turned by 45 degrees in a 64 px image: its white outline is drawn, the corners and sides of the
    axis-aligned 32 x 32 rectangle of the same centre (what was drawn before) are not."""
    size = 64
    targets = torch.tensor([[0.0, 1.0, 0.5, 0.5, 0.5, 0.5, math.pi / 4]])
    batch = {"images": torch.zeros(1, 3, size, size, dtype=torch.uint8), "targets": targets}
    module = types.SimpleNamespace(task=get_task("obb"), hparams=types.SimpleNamespace(class_names=None))
    trainer = types.SimpleNamespace(loggers=[], global_step=0, current_epoch=0, default_root_dir=tmp_path)
    outputs = {"detections": [torch.zeros(0, 7)]}
    ValidationImages()._draw_and_save(trainer, module, outputs, batch)  # type: ignore[arg-type]

    grid = cv2.cvtColor(cv2.imread(str(tmp_path / "val_images" / "epoch_000.png")), cv2.COLOR_BGR2RGB)
    image = grid[:size, :size]
    box = torch.tensor([32.0, 32.0, 32.0, 32.0, math.pi / 4])
    assert all(_lit(image, _outline_points(box)))
    assert (image.max(-1) == image.min(-1)).all() and image.max() > 200  # white (grey where smoothed)
    # The upright rectangle's corners and the midpoints of its sides.
    upright = [(16, 16), (48, 16), (16, 48), (48, 48), (32, 16), (16, 32), (48, 32), (32, 48)]
    assert not any(_lit(image, upright)), _lit(image, upright)


def test_detection_ground_truth_stays_the_upright_box() -> None:
    image = np.zeros((64, 64, 3), np.uint8)
    batch = {"targets": torch.tensor([[0.0, 1.0, 0.5, 0.5, 0.5, 0.5]])}
    drawn = get_task("detect").draw_ground_truth(image, batch, 0)
    assert all(_lit(drawn, [(16, 32), (48, 32), (32, 48), (24, 16)]))
    assert (drawn.max(-1) == drawn.min(-1)).all() and drawn.max() > 200  # white (grey where smoothed)


def test_predict_draws_the_rotated_outline_and_its_label_only(tmp_path: Path) -> None:
    """The annotated copy of an OBB prediction: the rotated outline and a label above its topmost corner, no
    axis-aligned extent box (which was drawn over it before)."""
    size = 128
    rbox = torch.tensor([[64.0, 64.0, 64.0, 64.0, math.pi / 4]])
    pts = corners(rbox)[0]
    extent = torch.cat((pts.amin(0), pts.amax(0)))  # about 18.7 .. 109.3
    det = torch.cat((extent, torch.tensor([0.9, 1.0])))[None].numpy()
    writer = PredictionWriter(tmp_path, names=["plane", "ship"])
    writer.task = get_task("obb")
    drawn = writer._draw(np.zeros((size, size, 3), np.uint8), det, {"rboxes": rbox})

    assert all(_lit(drawn, _outline_points(rbox[0])))
    x1, y1, x2, y2 = extent.tolist()
    extent_sides = [(x1, 100), (x2, 100), (40, y2), (88, y2), (x1, 30), (x2, 30), (x1, y2), (x2, y2)]
    assert not any(_lit(drawn, extent_sides)), _lit(drawn, extent_sides)
    # The label: written above the topmost corner, nowhere else.
    above = drawn[: int(pts[:, 1].min()) - 1]
    assert above.any() and not drawn[int(y1) + 2 :, : int(x1) - 2].any()
