"""Oriented-box data: corner rows through every augmentation step against the oracle, augmentation statistics
against the oracle's dataset, the batch's (N, 7) targets, ``check-data --task obb`` and the synthetic set.

The oracle (``ultralytics``, YOLO_OFFLINE=1) carries OBB labels as 100-point segments through its transforms and
turns them into ``xywhr`` with ``cv2.minAreaRect`` in ``Format``; ours moves ``ObbCorners`` through ``Instances``
and turns them in ``ObbTask.sample_targets``. Given the same labels and the same warp matrix, both must give the
same rotated boxes.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from yolo11_lightning.cli import check_data
from yolo11_lightning.data.augment.transforms import random_affine_matrix
from yolo11_lightning.structures.instances import Instances
from yolo11_lightning.structures.records import ImageRecord
from yolo11_lightning.synthetic.shapes import make_synthetic_dataset
from yolo11_lightning.tasks import get_task
from yolo11_lightning.tasks.obb.labels import ObbCorners, corner_problem, rotated_boxes
from yolo11_lightning.tasks.obb.rotated import corners

os.environ.setdefault("YOLO_OFFLINE", "1")

SIZE = 64
TASK = get_task("obb")


def _random_record(rng: np.random.Generator, height: int, width: int, n: int) -> ImageRecord:
    """n oriented boxes (some crossing the image border, clipped to it as the parser does), normalised."""
    quads = []
    for _ in range(n):
        centre = rng.uniform(0.05, 0.95, 2) * (width, height)
        half = rng.uniform(3, 0.35 * min(height, width), 2)
        angle = rng.uniform(0, np.pi)
        box = torch.tensor([*centre, *(2 * half), angle], dtype=torch.float64)
        quads.append((corners(box).numpy() / (width, height)).clip(0, 1))
    boxes = [[*(q.min(0) + q.max(0)) / 2, *(q.max(0) - q.min(0))] for q in quads]
    return ImageRecord("x.png", height, width, rng.integers(0, 3, n), boxes, np.concatenate(quads), [4] * n)


def _oracle_instances(record: ImageRecord, width: float, height: float):
    """The oracle dataset's ``Instances`` of a record (100-point segments), in pixels of width x height."""
    from ultralytics.utils.instance import Instances as OracleInstances
    from ultralytics.utils.ops import resample_segments

    segments = np.stack(resample_segments([p.copy() for p in record.polygons], n=100))
    inst = OracleInstances(record.boxes.copy(), segments, None, bbox_format="xywh", normalized=True)
    inst.denormalize(width, height)
    return inst


def _oracle_after_warp(image_hw, inst, classes, matrix, zoom, border, flips):
    """The oracle's RandomPerspective (its draw replaced by ``matrix``), flips and Format(return_obb)."""
    from ultralytics.data.augment import Format, RandomFlip, RandomPerspective

    perspective = RandomPerspective()
    size = SIZE
    m32 = np.asarray(matrix, np.float32)  # the oracle draws float32 matrices
    perspective.affine_transform = lambda img, border: (np.zeros((size, size, 3), np.uint8), m32, zoom)
    labels = {"img": np.zeros((*image_hw, 3), np.uint8), "cls": classes[:, None].astype(np.float32),
              "instances": inst}  # fmt: skip
    if border:
        labels["mosaic_border"] = (-size // 2, -size // 2)
    labels = perspective(labels)
    for direction in flips:
        labels = RandomFlip(p=1.0, direction=direction)(labels)
    fmt = Format(
        bbox_format="xywh", normalize=True, return_mask=False, return_keypoint=False, return_obb=True
    )
    out = fmt(labels)
    return out["cls"].reshape(-1).numpy(), out["bboxes"].numpy()


def _ours_after_warp(instances: Instances, matrix, zoom, flips):
    instances = instances.warped(matrix, zoom, (SIZE, SIZE))
    for direction in flips:
        instances = instances.flipped_lr(SIZE) if direction == "horizontal" else instances.flipped_ud(SIZE)
    _, extra = TASK.sample_targets((SIZE, SIZE), instances, {})
    return instances.classes, extra["rboxes"].numpy()


def _same_boxes(ours: np.ndarray, oracle: np.ndarray, tol: float) -> int:
    """Equal rotated boxes: the same corners (in any order) within ``tol`` of the image side; returns how many
    are ties instead: two different rectangles of the same area (within 1e-4) around one outline.

    A warped box is a parallelogram (a quadrilateral under perspective), whose smallest rotated rectangle can have
    two candidates of almost equal area: points that differ in their last float bits (float32 vs float64 warp
    matrices) make ``minAreaRect`` pick either, on both sides alike."""
    assert ours.shape == oracle.shape
    ties = 0
    for a, b in zip(ours, oracle):
        ca = corners(torch.tensor(a, dtype=torch.float64)).numpy()
        cb = corners(torch.tensor(b, dtype=torch.float64)).numpy()
        distance = np.abs(ca[:, None, :] - cb[None, :, :]).max(-1).min(1)
        if distance.max() > tol:
            assert abs(a[2] * a[3] - b[2] * b[3]) <= 1e-4 * max(a[2] * a[3], 1e-6), (a, b)
            ties += 1
    return ties


FLIPS = [(), ("horizontal",), ("vertical",), ("horizontal", "vertical")]


@pytest.mark.parametrize("mosaic", [False, True])
def test_obb_round_trip_through_every_augmentation_equals_the_oracle(mosaic: bool) -> None:
    """Letterbox or mosaic placement, clipping, the warp (rotation, shear, perspective, zoom, shift), the box
    filter, both flips and the final xywhr: the same boxes and classes as the oracle's, within 1e-4 of the side."""
    rng = np.random.default_rng(7 + mosaic)
    compared = ties = 0
    for trial in range(24):
        records = [_random_record(rng, *(int(v) for v in rng.integers(40, 120, 2)), int(rng.integers(1, 6)))
                   for _ in range(4 if mosaic else 1)]  # fmt: skip
        if mosaic:
            offsets = [(int(rng.integers(0, SIZE)), int(rng.integers(0, SIZE))) for _ in records]
            ours = Instances.tiled(
                [Instances.from_record(r, r.width, r.height, (ObbCorners,)) for r in records], offsets,
                (2 * SIZE, 2 * SIZE),
            )  # fmt: skip
            from ultralytics.utils.instance import Instances as OracleInstances

            parts = []
            for r, (ox, oy) in zip(records, offsets):
                inst = _oracle_instances(r, r.width, r.height)
                inst.convert_bbox("xyxy")
                inst.add_padding(ox, oy)
                parts.append(inst)
            oracle = OracleInstances.concatenate(parts)
            oracle.clip(2 * SIZE, 2 * SIZE)
            good = oracle.remove_zero_area_boxes()
            classes = np.concatenate([r.classes for r in records])[good]
            canvas = (2 * SIZE, 2 * SIZE)
        else:
            (r,) = records
            scale = SIZE / max(r.height, r.width)
            pad = (float(rng.integers(0, 8)), float(rng.integers(0, 8)))
            ours = Instances.from_record(r, r.width, r.height, (ObbCorners,)).placed(scale, pad)
            oracle = _oracle_instances(r, r.width, r.height)
            oracle.convert_bbox("xyxy")
            oracle.scale(scale, scale)
            oracle.add_padding(*pad)
            classes = r.classes
            canvas = (SIZE, SIZE)
        assert len(ours) == len(oracle)
        np.testing.assert_allclose(ours.fields["corners"].points, oracle.segments, atol=1e-3)
        matrix, zoom = random_affine_matrix(
            np.random.default_rng(trial), in_wh=canvas, out_wh=(SIZE, SIZE), degrees=30, translate=0.2,
            scale=0.5, shear=10, perspective=0.0005 * (trial % 2),
        )  # fmt: skip
        flips = FLIPS[trial % len(FLIPS)]
        our_classes, our_boxes = _ours_after_warp(ours, matrix, zoom, flips)
        oracle_classes, oracle_boxes = _oracle_after_warp(
            canvas[::-1], oracle, classes, matrix, zoom, mosaic, flips
        )
        np.testing.assert_array_equal(our_classes, oracle_classes)
        ties += _same_boxes(our_boxes, oracle_boxes, 1e-4)
        compared += len(our_boxes)
    assert compared > 30 and ties <= compared // 4, (compared, ties)


def test_rotated_boxes_are_the_oracle_xywhr() -> None:
    from ultralytics.utils.ops import xyxyxyxy2xywhr

    rng = np.random.default_rng(0)
    points = rng.uniform(0, 50, (20, 100, 2)).astype(np.float32)
    np.testing.assert_allclose(rotated_boxes(points), xyxyxyxy2xywhr(points.reshape(20, -1)), atol=1e-5)


# ------------------------------------------------------------------------------------------ statistics
@pytest.fixture(scope="module")
def obb_yaml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_dataset(
        tmp_path_factory.mktemp("synthetic_obb"), num_train=16, num_val=4, image_size=SIZE, task="obb"
    )


def _stats(samples) -> dict[str, np.ndarray]:
    counts, long_side, short_side, angle, centre = [], [], [], [], []
    for rboxes in samples:
        counts.append(len(rboxes))
        long_side += np.maximum(rboxes[:, 2], rboxes[:, 3]).tolist()
        short_side += np.minimum(rboxes[:, 2], rboxes[:, 3]).tolist()
        # the long side's direction, modulo pi (the same whatever minAreaRect's angle range)
        direction = np.where(rboxes[:, 2] >= rboxes[:, 3], rboxes[:, 4], rboxes[:, 4] + np.pi / 2)
        angle += (direction % np.pi).tolist()
        centre += rboxes[:, :2].tolist()
    q = [0.1, 0.5, 0.9]
    return {
        "boxes per sample": np.array([np.mean(counts)]),
        "long side q": np.quantile(long_side, q),
        "short side q": np.quantile(short_side, q),
        "direction q": np.quantile(angle, q),
        "centre q": np.quantile(np.asarray(centre), q, axis=0).reshape(-1),
    }


def test_augmentation_statistics_match_the_oracle(obb_yaml: Path) -> None:
    """2000 default-augmented samples per side (mosaic, scale 0.5, translate 0.1, flips): boxes per sample and the
    quantiles of the rotated boxes' sides, directions and centres agree with the oracle's dataset."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    from yolo11_lightning.data.dataset import BoxDataset
    from yolo11_lightning.data.sources.config import load_dataset_config
    from yolo11_lightning.data.sources.split import load_split

    samples = 2000
    records, _ = load_split(load_dataset_config(obb_yaml), "train")
    ours_ds = BoxDataset(records, SIZE, augment=True, task=get_task("obb"), seed=0)
    ours = _stats(ours_ds[(k // len(records), k % len(records))]["rboxes"].numpy() for k in range(samples))
    random.seed(0)
    np.random.seed(0)
    data = check_det_dataset(str(obb_yaml))
    cfg = get_cfg(overrides={"imgsz": SIZE, "task": "obb"})
    oracle_ds = build_yolo_dataset(cfg, data["train"], batch=16, data=data, mode="train")
    oracle = _stats(oracle_ds[k % len(oracle_ds)]["bboxes"].numpy().reshape(-1, 5) for k in range(samples))
    tolerance = {"boxes per sample": 0.15, "long side q": 0.03, "short side q": 0.02, "direction q": 0.12,
                 "centre q": 0.04}  # fmt: skip
    for key, ours_value in ours.items():
        assert np.abs(ours_value - oracle[key]).max() <= tolerance[key] * max(1.0, np.abs(oracle[key]).max()), (
            key, ours_value, oracle[key],
        )  # fmt: skip


# ------------------------------------------------------------------------------------------ batches, checks
def test_obb_batches_carry_rotated_targets(obb_yaml: Path) -> None:
    from yolo11_lightning.data.dataset import BoxDataset
    from yolo11_lightning.data.sources.config import load_dataset_config
    from yolo11_lightning.data.sources.split import load_split

    records, _ = load_split(load_dataset_config(obb_yaml), "val")
    dataset = BoxDataset(records, SIZE, task=get_task("obb"))
    batch = TASK.collate([dataset[i] for i in range(len(records))])
    targets = batch["targets"]
    assert targets.shape == (sum(len(r.classes) for r in records), 7)
    # validation: the letterboxed corners' rotated rectangle, the label's own box
    first = records[0]
    quads = np.stack(first.polygons) * (first.width, first.height)
    truth = rotated_boxes(quads) / np.array(
        [first.width, first.height, first.width, first.height, 1], np.float32
    )
    assert _same_boxes(targets[targets[:, 0] == 0, 2:].numpy(), truth, 1e-4) == 0
    empty = TASK.collate([{**dataset[0], "missing": True}])
    assert empty["targets"].shape == (0, 7)


def test_corner_problems() -> None:
    square = [0.1, 0.1, 0.3, 0.1, 0.3, 0.3, 0.1, 0.3]
    assert corner_problem(square) is None
    assert "9 values" in corner_problem(square[:6])
    assert "corners 2 and 3 are the same" in corner_problem([0.1, 0.1, 0.3, 0.1, 0.3, 0.1, 0.1, 0.3])
    assert "zero area" in corner_problem([0.1, 0.1, 0.2, 0.2, 0.3, 0.3, 0.4, 0.4])
    assert "self-intersecting" in corner_problem([0.1, 0.1, 0.3, 0.3, 0.3, 0.1, 0.1, 0.3])


def test_check_data_names_bad_obb_rows(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    yaml_path = make_synthetic_dataset(tmp_path / "set", num_train=2, num_val=1, image_size=SIZE, task="obb")
    label = tmp_path / "set" / "labels" / "train" / "train_00000.txt"
    rows = label.read_text().splitlines()
    label.write_text("\n".join([*rows,
        "0 0.1 0.1 0.3 0.3 0.3 0.1 0.1 0.3",  # bow tie
        "1 0.1 0.1 0.3 0.1 0.3 0.1 0.1 0.3",  # a repeated corner
        "2 0.1 0.1 0.3 0.1 0.2 0.3",  # a triangle
    ]) + "\n")  # fmt: skip
    assert check_data.main(["--dataset", str(yaml_path), "--no-images", "--no-cache", "--task", "obb"]) == 0
    out = capsys.readouterr().out
    first = len(rows) + 1
    assert f"{label}:{first}: self-intersecting oriented box" in out
    assert f"{label}:{first + 1}: degenerate oriented box: corners 2 and 3" in out
    assert f"{label}:{first + 2}: an oriented box has 9 values" in out
    assert check_data.main(["--dataset", str(yaml_path), "--no-images", "--no-cache"]) == 0
    assert "oriented box" not in capsys.readouterr().out  # detection's rules: polygons are fine


def test_synthetic_obb_set_labels_the_painted_objects(obb_yaml: Path) -> None:
    """Each label's rotated rectangle covers its painted object: the pixels inside it are mostly the object's
    (bright), the ones just outside mostly background."""
    import cv2

    root = obb_yaml.parent
    inside = outside = 0.0
    for image_path in sorted((root / "images" / "train").glob("*.png"))[:8]:
        image = cv2.imread(str(image_path))
        h, w = image.shape[:2]
        bright = image.max(2) > 150
        rows = (root / "labels" / "train" / f"{image_path.stem}.txt").read_text().split("\n")
        for row in filter(None, rows):
            quad = (np.array(row.split()[1:], np.float64).reshape(4, 2) * (w, h)).astype(np.float32)
            mask = np.zeros((h, w), np.uint8)
            cv2.fillPoly(mask, [np.round(quad).astype(np.int32)], 1)
            inside += bright[mask > 0].mean()
            grown = cv2.dilate(mask, np.ones((5, 5), np.uint8)) - mask
            outside += bright[grown > 0].mean()
    assert inside > 4 * outside


def _batches(yaml_path: Path, num_workers: int, **kwargs) -> list[dict]:
    from yolo11_lightning.training.datamodule import YOLODataModule

    dm = YOLODataModule(
        str(yaml_path), batch_size=8, image_size=SIZE, num_workers=num_workers, pin_memory=False,
        persistent_workers=False, task="obb", degrees=10.0, mixup=0.5, **kwargs,
    )  # fmt: skip
    dm.prepare_data()
    dm.setup("fit")
    return list(dm.train_dataloader()) + list(dm.val_dataloader())


def test_obb_batches_are_the_same_with_workers_and_the_ram_cache(obb_yaml: Path) -> None:
    """The world-size-invariant order and per-sample seeds carry the corners unchanged: 0 workers, 2 workers and
    the RAM image cache give the same batches, targets (N, 7) included."""
    plain = _batches(obb_yaml, 0)
    for other in (_batches(obb_yaml, 2), _batches(obb_yaml, 0, cache_images=True)):
        assert len(other) == len(plain)
        for a, b in zip(plain, other):
            for key in ("images", "targets", "indices"):
                assert torch.equal(a[key], b[key]), key
    assert all(b["targets"].shape[1] == 7 for b in plain) and sum(len(b["targets"]) for b in plain) > 20


def test_rank_agreement_hash_covers_the_corners(obb_yaml: Path) -> None:
    from yolo11_lightning.data.agreement import record_digests
    from yolo11_lightning.data.dataset import BoxDataset
    from yolo11_lightning.data.sources.config import load_dataset_config
    from yolo11_lightning.data.sources.split import load_split

    records, _ = load_split(load_dataset_config(obb_yaml), "val")
    moved = [ImageRecord(r.path, r.height, r.width, r.classes, r.boxes, r.segments.copy(), r.segment_sizes)
             for r in records]  # fmt: skip
    moved[1].segments[2] += np.float32(0.01)  # one corner of one image
    a, b = (record_digests(BoxDataset(r, SIZE, task=get_task("obb"))) for r in (records, moved))
    assert [x != y for x, y in zip(a, b)] == [i == 1 for i in range(len(records))]
