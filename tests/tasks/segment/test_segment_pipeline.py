"""Segmentation batches end to end: dataset / DataModule with ``task="segment"``.

Masks of augmented samples are checked against the image itself: every instance is painted in its class
colour, so the warped image shows where the transformed ground truth is, independently of the polygon
maths. Then determinism over workers, the detection task left as it was, and a COCO json (polygon, RLE
and box-only annotations) into masks. Validation masks are checked against the reference's datasets
(``ultralytics``, an oracle only): pixel for pixel, rows in the same order.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from yolo11_lightning.data.agreement import first_difference, record_digests, split_hash
from yolo11_lightning.data.augment.pipeline import AugmentConfig
from yolo11_lightning.data.dataset import BoxDataset
from yolo11_lightning.data.sources.config import load_dataset_config
from yolo11_lightning.data.sources.split import load_split
from yolo11_lightning.structures.records import ImageRecord
from yolo11_lightning.synthetic.shapes import make_synthetic_dataset
from yolo11_lightning.tasks import get_task
from yolo11_lightning.training.datamodule import YOLODataModule

os.environ.setdefault("YOLO_OFFLINE", "1")  # the reference datasets (oracle) stay offline

SIZE = 64
PAINTED_SIZE = 128  # the painted-truth tests: objects large against the rasteriser's outline pixels
# Class colours (RGB), then black background and the grey of padding / outside the warp.
PALETTE = np.array([(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 0, 0), (114, 114, 114)])
NUM_CLASSES = 4


def _painted_records(folder: Path, n: int = 8, seed: int = 0) -> list[ImageRecord]:
    """n PNGs of random sizes; instance c (class c) painted in ``PALETTE[c]`` in its own quadrant.

    Classes 0-2 are polygons (labelled with their outline); class 3 is a rectangle labelled by its box
    only, so its mask comes from the box-outline fallback. Objects are large: the reference's rasteriser
    fills the outline's pixels too (about half a pixel more per side than the painted area), which would
    dominate the IoU of objects a few pixels wide.
    """
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        h, w = (int(v) for v in rng.integers(96, 193, 2))
        image = np.zeros((h, w, 3), np.uint8)
        boxes, segments, sizes = [], [], []
        for c in range(NUM_CLASSES):
            cx, cy = (c % 2 + 0.5) * w / 2, (c // 2 + 0.5) * h / 2
            rx, ry = rng.uniform(0.3, 0.45) * w / 2, rng.uniform(0.3, 0.45) * h / 2
            if c < 3:
                k = int(rng.integers(5, 13))
                t = np.sort(rng.uniform(0, 2 * np.pi, k))
                outline = np.stack([cx + rx * np.cos(t), cy + ry * np.sin(t)], 1)
                cv2.fillPoly(image, [outline.astype(np.int32)], PALETTE[c].tolist())
                lo, hi = outline.astype(np.int32).min(0), outline.astype(np.int32).max(0) + 1
                segments.append(outline / [w, h])
                sizes.append(k)
            else:
                lo, hi = np.array([cx - rx, cy - ry], int), np.array([cx + rx, cy + ry], int)
                image[lo[1] : hi[1], lo[0] : hi[0]] = PALETTE[c]
                sizes.append(0)
            boxes.append(
                [(lo[0] + hi[0]) / 2 / w, (lo[1] + hi[1]) / 2 / h, (hi[0] - lo[0]) / w, (hi[1] - lo[1]) / h]
            )
        path = folder / f"img{i}.png"
        cv2.imwrite(str(path), image[..., ::-1])
        records.append(
            ImageRecord(str(path), h, w, np.arange(NUM_CLASSES), boxes, np.concatenate(segments), sizes)
        )
    return records


@pytest.fixture(scope="module")
def painted(tmp_path_factory: pytest.TempPathFactory) -> list[ImageRecord]:
    return _painted_records(tmp_path_factory.mktemp("painted"))


def _class_masks(sample: dict, overlap: bool) -> np.ndarray:
    """(NUM_CLASSES, H/4, W/4) bool: the union of the sample's masks of each class."""
    masks, classes = sample["masks"].numpy(), sample["labels"][:, 0].long().numpy()
    out = np.zeros((NUM_CLASSES, *masks.shape[-2:]), bool)
    for row, c in enumerate(classes):
        out[c] |= (masks == row + 1) if overlap else masks[row].astype(bool)
    return out


def _painted_truth(image: torch.Tensor) -> np.ndarray:
    """(NUM_CLASSES, H/4, W/4) bool: pixels of the (augmented) image nearest each class colour, shrunk
    like the rasteriser shrinks its fills (bilinear 1/4 of a 0/1 full-resolution mask)."""
    pixels = image.permute(1, 2, 0).numpy().astype(np.int32)
    nearest = ((pixels[:, :, None, :] - PALETTE[None, None]) ** 2).sum(-1).argmin(-1)
    h, w = nearest.shape
    return np.stack(
        [
            cv2.resize((nearest == c).astype(np.uint8), (w // 4, h // 4)).astype(bool)
            for c in range(NUM_CLASSES)
        ]
    )


GEOMETRIES = {
    "default": AugmentConfig(hsv_h=0, hsv_s=0, hsv_v=0, flipud=0.5),
    "rotate_shear_perspective": AugmentConfig(
        hsv_h=0, hsv_s=0, hsv_v=0, degrees=20, shear=8, perspective=0.0005, flipud=0.5
    ),
    "no_mosaic": AugmentConfig(hsv_h=0, hsv_s=0, hsv_v=0, mosaic=0.0, degrees=15),
}


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_augmented_masks_match_the_painted_ground_truth(painted, geometry: str, overlap: bool) -> None:
    aug = GEOMETRIES[geometry]
    inter = union = 0
    for seed in (0, 1, 2):
        dataset = BoxDataset(
            painted,
            PAINTED_SIZE,
            augment=True,
            aug=aug,
            seed=seed,
            task=get_task("segment"),
            mask_overlap=overlap,
        )
        for index in range(len(painted)):
            sample = dataset[(seed, index)]
            labels, masks = sample["labels"], sample["masks"]
            assert masks.shape == (
                (PAINTED_SIZE // 4,) * 2 if overlap else (len(labels), PAINTED_SIZE // 4, PAINTED_SIZE // 4)
            )
            predicted, truth = _class_masks(sample, overlap), _painted_truth(sample["image"])
            inter += (predicted & truth).sum()
            union += (predicted | truth).sum()
            # Boxes come from the warped outlines: each one holds its instance's mask.
            for row, (_, cx, cy, bw, bh) in enumerate(labels.numpy()):
                mask = (masks.numpy() == row + 1) if overlap else masks[row].numpy().astype(bool)
                ys, xs = np.nonzero(mask)
                if len(xs):
                    assert (
                        xs.min() * 4 >= (cx - bw / 2) * PAINTED_SIZE - 4
                        and (xs.max() + 1) * 4 <= (cx + bw / 2) * PAINTED_SIZE + 4
                    )
                    assert (
                        ys.min() * 4 >= (cy - bh / 2) * PAINTED_SIZE - 4
                        and (ys.max() + 1) * 4 <= (cy + bh / 2) * PAINTED_SIZE + 4
                    )
    assert union > 1000  # the samples do contain objects
    assert inter / union >= 0.9, (geometry, inter / union)


@pytest.mark.parametrize("rect", [False, True])
@pytest.mark.parametrize("gain", ["reference", "per_axis"])
def test_validation_masks_are_letterboxed_like_the_image(painted, rect: bool, gain: str) -> None:
    dataset = BoxDataset(painted, PAINTED_SIZE, task=get_task("segment"), eval_box_gain=gain)
    if rect:
        dataset.set_rect_batches(2)
    shapes = set()
    for index in range(len(painted)):
        sample = dataset[index]
        truth, predicted = _painted_truth(sample["image"]), _class_masks(sample, True)
        assert (predicted & truth).sum() / (predicted | truth).sum() >= 0.9
        assert sample["labels"].shape == (NUM_CLASSES, 5)
        assert sample["masks"].shape == tuple(side // 4 for side in sample["image"].shape[1:])
        shapes.add(tuple(sample["image"].shape))
    assert len(shapes) > 1 if rect else shapes == {(3, PAINTED_SIZE, PAINTED_SIZE)}


# ------------------------------------------------------------------------------------------ DataModule
@pytest.fixture(scope="module")
def seg_yaml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_dataset(
        tmp_path_factory.mktemp("synthetic_seg"), num_train=16, num_val=6, image_size=SIZE, task="segment"
    )


def _batches(yaml_path: Path, task: str, num_workers: int, **kwargs) -> tuple[list[dict], list[dict]]:
    dm = YOLODataModule(
        str(yaml_path), batch_size=8, image_size=SIZE, num_workers=num_workers, pin_memory=False,
        persistent_workers=False, task=task, degrees=10.0, mixup=0.5, **kwargs,
    )  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    return list(dm.train_dataloader()), list(dm.val_dataloader())


def _assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in ("images", "targets", "masks", "indices"):
            if key in x:
                assert x[key].dtype == y[key].dtype and torch.equal(x[key], y[key]), key


@pytest.mark.parametrize("overlap", [True, False])
def test_segment_batches_are_identical_with_0_and_2_workers(seg_yaml: Path, overlap: bool) -> None:
    train0, val0 = _batches(seg_yaml, "segment", 0, mask_overlap=overlap)
    train2, val2 = _batches(seg_yaml, "segment", 2, mask_overlap=overlap)
    _assert_same(train0, train2)
    _assert_same(val0, val2)
    for batch in train0 + val0:  # validation batches are rectangles (here 96 px: the reference's padding)
        assert batch["mask_overlap"] is overlap
        quarter = tuple(side // 4 for side in batch["images"].shape[-2:])
        if overlap:
            assert batch["masks"].shape == (len(batch["images"]), *quarter)
            for i in range(len(batch["images"])):  # index k of image i is its k-th target row
                rows = int((batch["targets"][:, 0] == i).sum())
                assert int(batch["masks"][i].max()) <= rows
        else:
            assert batch["masks"].shape == (len(batch["targets"]), *quarter)
    assert sum(int(b["masks"].bool().sum()) for b in train0) > 0


def test_detect_task_batches_stay_detection_batches(seg_yaml: Path) -> None:
    detect_train, detect_val = _batches(seg_yaml, "detect", 0)
    seg_train, seg_val = _batches(seg_yaml, "segment", 0)
    for det, seg in zip(detect_train + detect_val, seg_train + seg_val):
        assert "masks" not in det and "mask_overlap" not in det
        assert set(seg) - set(det) == {"masks", "mask_overlap"}
        # The segment path draws the same random numbers: the same augmented images.
        assert torch.equal(det["images"], seg["images"])
    for det, seg in zip(detect_val, seg_val):  # validation boxes are the records' boxes in both tasks
        order = lambda t: t[np.lexsort(t.numpy().T[::-1])]  # noqa: E731
        torch.testing.assert_close(order(det["targets"]), order(seg["targets"]))


def _rle_counts(mask: np.ndarray) -> list[int]:
    """Uncompressed COCO RLE counts of a 0/1 mask (column-major runs, starting with zeros)."""
    flat = mask.T.reshape(-1)
    changes = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], changes, [len(flat)]])).tolist()
    return [0, *runs] if flat[0] else runs


def test_coco_polygon_rle_and_box_annotations_become_masks(tmp_path: Path, caplog) -> None:
    h = w = SIZE
    image = np.zeros((h, w, 3), np.uint8)
    cv2.imwrite(str(tmp_path / "a.png"), image)
    disc = np.zeros((h, w), np.uint8)
    cv2.circle(disc, (16, 44), 12, 1, -1)
    triangle = np.array([[36, 6], [60, 6], [48, 28]], np.float32)
    expected = [np.zeros((h, w), np.uint8) for _ in range(3)]
    cv2.fillPoly(expected[0], [triangle.astype(np.int32)], 1)
    expected[1] = disc
    expected[2][36:60, 36:60] = 1  # box-only: its rectangle
    coco = {
        "images": [{"id": 1, "file_name": "a.png", "width": w, "height": h}],
        "categories": [{"id": 1, "name": "tri"}, {"id": 2, "name": "disc"}, {"id": 3, "name": "box"}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [36, 6, 24, 22], "segmentation": [triangle.reshape(-1).tolist()]},
            {"id": 2, "image_id": 1, "category_id": 2, "bbox": [4, 32, 25, 25], "segmentation": {"size": [h, w], "counts": _rle_counts(disc)}},
            {"id": 3, "image_id": 1, "category_id": 3, "bbox": [36, 36, 24, 24]},
        ],
    }  # fmt: skip
    (tmp_path / "train.json").write_text(json.dumps(coco))
    (tmp_path / "data.yaml").write_text("train: train.json\nval: train.json\n")
    for overlap in (True, False):
        dm = YOLODataModule(
            str(tmp_path / "data.yaml"), batch_size=1, image_size=SIZE, num_workers=0, pin_memory=False,
            task="segment", mask_overlap=overlap,
        )  # fmt: skip
        dm.prepare_data()
        with caplog.at_level(logging.WARNING, logger="yolo11_lightning.data.dataset"):
            dm.setup("validate")
        assert "1 of 3 instances have no polygon" in caplog.text
        caplog.clear()
        (batch,) = list(dm.val_dataloader())
        classes = batch["targets"][:, 1].long().tolist()
        assert sorted(classes) == [0, 1, 2]
        for row, c in enumerate(classes):
            mask = (batch["masks"][0] == row + 1) if overlap else batch["masks"][row].bool()
            canvas = np.zeros(batch["images"].shape[-2:], np.uint8)  # a rectangle batch: padded, scale 1
            left, top = (int(v) for v in batch["pads"][0])
            canvas[top : top + h, left : left + w] = expected[c]
            truth = torch.from_numpy(cv2.resize(canvas, (canvas.shape[1] // 4, canvas.shape[0] // 4))).bool()
            assert (mask & truth).sum() / (mask | truth).sum() >= 0.9, c


def test_rank_agreement_hash_covers_the_polygons(painted) -> None:
    moved = [
        ImageRecord(r.path, r.height, r.width, r.classes, r.boxes, r.segments.copy(), r.segment_sizes)
        for r in painted
    ]
    moved[3].segments[2] += np.float32(0.01)  # one vertex of one image
    seg_a, seg_b = (BoxDataset(r, SIZE, task=get_task("segment")) for r in (painted, moved))
    assert split_hash(seg_a) != split_hash(seg_b)
    differs = [a != b for a, b in zip(record_digests(seg_a), record_digests(seg_b))]
    assert differs == [i == 3 for i in range(len(painted))]
    assert first_difference([record_digests(seg_a), record_digests(seg_b)]).startswith("the labels")
    # Detection keeps no polygons: its hash is that of the boxes alone, as before.
    assert split_hash(BoxDataset(painted, SIZE)) == split_hash(BoxDataset(moved, SIZE))
    assert BoxDataset(painted, SIZE).records[0].num_polygons == 0
    assert seg_a.records[3].num_polygons == 3


def test_synthetic_segment_task_generates_the_polygon_set(tmp_path: Path) -> None:
    dm = YOLODataModule(
        "synthetic", synthetic_dir=str(tmp_path), synthetic_train=4, synthetic_val=2, synthetic_image_size=SIZE,
        image_size=SIZE, batch_size=2, num_workers=0, pin_memory=False, task="segment",
    )  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    train = dm.datasets["train"]
    assert all(train.records[i].num_polygons == len(train.records[i].classes) > 0 for i in range(len(train)))
    batch = next(iter(dm.train_dataloader()))
    assert batch["mask_overlap"] and batch["masks"].shape == (2, SIZE // 4, SIZE // 4)
    assert int(batch["masks"].max()) >= 1


@pytest.mark.parametrize("rect", [False, True])
@pytest.mark.parametrize("overlap", [True, False])
def test_validation_masks_equal_the_reference_datasets(tmp_path: Path, rect: bool, overlap: bool) -> None:
    from ultralytics.cfg import get_cfg
    from ultralytics.data.dataset import YOLODataset

    yaml_path = make_synthetic_dataset(tmp_path, num_train=1, num_val=8, image_size=(48, 80), task="segment")
    records, _ = load_split(load_dataset_config(yaml_path), "val")
    ours = BoxDataset(records, SIZE, task=get_task("segment"), mask_overlap=overlap)
    if rect:
        ours.set_rect_batches(4)
    reference = YOLODataset(
        img_path=str(tmp_path / "images" / "val"), imgsz=SIZE, augment=False, rect=rect, batch_size=4,
        stride=32, pad=0.5 if rect else 0.0, task="segment",
        hyp=get_cfg(overrides={"imgsz": SIZE, "overlap_mask": overlap}),
        data={"names": {0: "a", 1: "b", 2: "c"}, "nc": 3, "channels": 3},
    )  # fmt: skip
    expected = {s["im_file"]: s for s in (reference[i] for i in range(len(reference)))}
    for i, record in enumerate(records):
        sample, ref = ours[i], expected[record.path]
        assert torch.equal(sample["image"], ref["img"])
        assert torch.equal(sample["labels"][:, 0], ref["cls"].view(-1))  # the rows in the masks' order
        ref_masks = ref["masks"][0] if overlap else ref["masks"]
        assert torch.equal(sample["masks"], ref_masks.to(sample["masks"].dtype))
