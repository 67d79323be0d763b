"""Pose data: keypoint rows and their checks, records and cache, the ``Keypoints`` field through every geometric
step against the oracle (``ultralytics``' ``Instances``, ``RandomPerspective``, ``RandomFlip``, ``LetterBox``: a
test oracle only), the sample and batch, the synthetic pose set.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from data_files import pattern, write_image, write_labels, write_yaml

from yolo11_lightning.cli import check_data
from yolo11_lightning.data.augment.transforms import letterbox, random_affine_matrix
from yolo11_lightning.data.sources.config import DatasetError, load_dataset_config
from yolo11_lightning.data.sources.label_options import LabelOptions
from yolo11_lightning.data.sources.packed_records import PackedRecords
from yolo11_lightning.data.sources.split import load_split
from yolo11_lightning.structures.instances import Instances
from yolo11_lightning.structures.keypoints import Keypoints
from yolo11_lightning.structures.records import ImageRecord
from yolo11_lightning.synthetic.poses import FLIP_IDX, SYNTHETIC_KPT_SHAPE, make_synthetic_pose_dataset
from yolo11_lightning.tasks import get_task

os.environ.setdefault("YOLO_OFFLINE", "1")

K = 5


def _random_instances(
    rng: np.random.Generator, n: int, width: int, height: int
) -> tuple[np.ndarray, np.ndarray]:
    """n boxes (n, 4) xyxy pixels and keypoints (n, K, 3) around them (some outside the image), visibility
    0/1/2."""
    centre = rng.uniform([0, 0], [width, height], (n, 2))
    half = rng.uniform(4, 0.3 * min(width, height), (n, 2))
    boxes = np.concatenate([centre - half, centre + half], 1).clip(0, [width, height, width, height])
    xy = centre[:, None] + rng.uniform(-1.2, 1.2, (n, K, 2)) * half[:, None]
    visibility = rng.choice([0.0, 1.0, 2.0], (n, K), p=[0.2, 0.3, 0.5])
    return boxes.astype(np.float32), np.concatenate([xy, visibility[..., None]], -1).astype(np.float32)


def _oracle_instances(boxes: np.ndarray, keypoints: np.ndarray):
    from ultralytics.utils.instance import Instances as RefInstances

    return RefInstances(
        boxes.copy(), np.zeros((len(boxes), 0, 2), np.float32), keypoints.copy(), bbox_format="xyxy",
        normalized=False,
    )  # fmt: skip


def _ours(boxes: np.ndarray, keypoints: np.ndarray, flip_idx=FLIP_IDX) -> Instances:
    field = Keypoints(keypoints.copy(), None if flip_idx is None else np.asarray(flip_idx))
    return Instances(boxes.copy(), np.zeros(len(boxes), np.int64), {"keypoints": field})


def _oracle_warp(instances, matrix: np.ndarray, zoom: float, size: tuple[int, int], perspective: float):
    """The oracle's RandomPerspective after its affine_transform: boxes and keypoints through ``matrix``,
    clipped, filtered by ``box_candidates`` (no segments: area ratio 0.1)."""
    from ultralytics.data.augment import RandomPerspective
    from ultralytics.utils.instance import Instances as RefInstances

    oracle = RandomPerspective(perspective=perspective)
    oracle.size = size
    m = matrix.astype(np.float32)
    boxes = oracle.apply_bboxes(instances.bboxes, m)
    keypoints = oracle.apply_keypoints(instances.keypoints, m)
    new = RefInstances(
        boxes, np.zeros((len(boxes), 0, 2), np.float32), keypoints, bbox_format="xyxy", normalized=False
    )
    new.clip(*size)
    instances.scale(scale_w=zoom, scale_h=zoom, bbox_only=True)
    keep = oracle.box_candidates(box1=instances.bboxes.T, box2=new.bboxes.T, area_thr=0.10)
    return new[keep]


@pytest.mark.parametrize("trial", range(8))
def test_keypoints_through_mosaic_warp_mixup_and_flips_equal_the_oracle(trial: int) -> None:
    """One training sample's geometry step by step, ours and the oracle's on the same numbers: mosaic tiles
    placed and clipped to the canvas, the random warp (with perspective on odd trials), mixup's concatenation,
    the vertical and horizontal flips with ``flip_idx``. Boxes, keypoints and visibility equal."""
    from ultralytics.data.augment import RandomFlip
    from ultralytics.utils.instance import Instances as RefInstances

    rng = np.random.default_rng(trial)
    size = 64
    canvas = (2 * size, 2 * size)

    def warped_tiles() -> tuple[Instances, object]:
        ours, refs, offsets = [], [], []
        for _ in range(4):
            boxes, keypoints = _random_instances(rng, int(rng.integers(0, 4)), size, size)
            ours.append(_ours(boxes, keypoints))
            ref = _oracle_instances(boxes, keypoints)
            offset = (
                int(rng.integers(-size // 2, size + size // 2)),
                int(rng.integers(-size // 2, size + size // 2)),
            )
            ref.add_padding(*offset)
            refs.append(ref)
            offsets.append(offset)
        mine = Instances.tiled(ours, offsets, canvas)
        ref = RefInstances.concatenate(refs, axis=0)
        ref.clip(*canvas)
        ref.remove_zero_area_boxes()
        np.testing.assert_allclose(mine.boxes, ref.bboxes, atol=1e-4)
        np.testing.assert_allclose(mine.fields["keypoints"].points, ref.keypoints, atol=1e-4)
        perspective = 0.001 if trial % 2 else 0.0
        matrix, zoom = random_affine_matrix(
            np.random.default_rng(trial), in_wh=canvas, out_wh=(size, size), degrees=30, translate=0.2,
            scale=0.5, shear=5, perspective=perspective,
        )  # fmt: skip
        mine = mine.warped(matrix, zoom, (size, size))
        ref = _oracle_warp(ref, matrix, zoom, (size, size), perspective)
        np.testing.assert_allclose(mine.boxes, ref.bboxes, atol=1e-3)
        np.testing.assert_allclose(mine.fields["keypoints"].points, ref.keypoints, atol=1e-3)
        return mine, ref

    (a, ra), (b, rb) = warped_tiles(), warped_tiles()
    mine = Instances.concat([a, b])
    ref = RefInstances.concatenate([ra, rb], axis=0)
    image = np.zeros((size, size, 3), np.uint8)
    for direction in ("vertical", "horizontal"):
        mine = mine.flipped_ud(size) if direction == "vertical" else mine.flipped_lr(size)
        labels = RandomFlip(p=1.0, direction=direction, flip_idx=list(FLIP_IDX))(
            {"img": image, "instances": ref}
        )
        ref = labels["instances"]
        ref.convert_bbox("xyxy")
        np.testing.assert_allclose(mine.boxes, ref.bboxes, atol=1e-3)
        np.testing.assert_allclose(mine.fields["keypoints"].points, ref.keypoints, atol=1e-3)
    visibility = mine.fields["keypoints"].points[..., 2]
    assert set(np.unique(visibility)) <= {0.0, 1.0, 2.0}


def test_letterbox_and_evaluation_keypoints_equal_the_oracle() -> None:
    """The reference's LetterBox (scale, then pad) moves the keypoints as ``placed`` does; a flip without
    ``flip_idx`` only mirrors."""
    from ultralytics.data.augment import LetterBox

    rng = np.random.default_rng(5)
    h, w = 50, 80
    boxes, keypoints = _random_instances(rng, 3, w, h)
    ref = _oracle_instances(boxes, keypoints)
    labels = LetterBox((64, 64), auto=False, scaleup=True)(
        labels={"img": np.zeros((h, w, 3), np.uint8), "instances": ref, "cls": np.zeros((3, 1))}
    )
    _, ratio, (left, top) = letterbox(np.zeros((h, w, 3), np.uint8), 64)
    assert labels["img"].shape == (64, 64, 3)
    mine = _ours(boxes, keypoints).placed(ratio, (left, top))
    np.testing.assert_allclose(mine.fields["keypoints"].points, labels["instances"].keypoints, atol=1e-3)
    plain = _ours(boxes, keypoints, flip_idx=None).flipped_lr(w).fields["keypoints"].points
    np.testing.assert_allclose(plain[..., 0], w - keypoints[..., 0], atol=1e-5)
    np.testing.assert_array_equal(plain[..., 2], keypoints[..., 2])


# ------------------------------------------------------------------------------------------ files
POSE_ROWS = [  # (row, reason it is refused or None), kpt_shape (2, 3)
    ("0 0.5 0.5 0.4 0.4 0.4 0.4 2 0.6 0.6 1", None),
    ("1 0.3 0.3 0.2 0.2 0.3 0.3 0 0 0 0", None),
    ("0 0.5 0.5 0.4 0.4 0.4 0.4 2", "expected 11 values"),
    ("0 0.5 0.5 0.4 0.4 0.4 0.4 3 0.6 0.6 1", "keypoint 0 has visibility 3, not 0, 1 or 2"),
    ("0 0.5 0.5 0.4 0.4 0.4 nan 2 0.6 0.6 1", "not a finite number"),
    ("0 0.5 0.5 0.4 0.4 0.4 1.5 2 0.6 0.6 1", "keypoint 0 at (0.4, 1.5) is outside the image"),
    ("0 0.5 0.5 0.4 0.4", "expected 11 values"),
]


def _pose_dataset(tmp_path: Path, rows: list[str], **keys) -> Path:
    write_image(tmp_path / "images" / "a.png", pattern(40, 60))
    write_labels(tmp_path / "labels" / "a.txt", rows)
    return write_yaml(tmp_path / "d.yaml", {"train": "images", "val": "images", "names": ["a", "b"], **keys})


def test_pose_rows_become_keypoints_and_check_data_names_bad_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    yaml_path = _pose_dataset(tmp_path, [r for r, _ in POSE_ROWS], kpt_shape=[2, 3], flip_idx=[1, 0])
    config = load_dataset_config(yaml_path)
    assert config.options.kpt_shape == (2, 3) and config.options.flip_idx == (1, 0)
    (rec,), report = load_split(config, "train", use_cache=False)
    assert rec.classes.tolist() == [0, 1] and report.num_skipped_rows == 5
    np.testing.assert_allclose(rec.keypoints[0], [[0.4, 0.4, 2], [0.6, 0.6, 1]], atol=1e-6)
    np.testing.assert_allclose(rec.keypoints[1], [[0.3, 0.3, 0], [0, 0, 0]], atol=1e-6)
    assert rec.flip_idx.tolist() == [1, 0]
    # The cache keeps the keypoints; flip_idx comes from the yaml.
    load_split(config, "train")
    (cached,), _ = load_split(config, "train")
    np.testing.assert_array_equal(cached.keypoints, rec.keypoints)
    assert check_data.main(["--dataset", str(yaml_path), "--no-images", "--no-cache"]) == 0
    printed = capsys.readouterr().out
    label = tmp_path / "labels" / "a.txt"
    for line_no, (_, why) in enumerate(POSE_ROWS, 1):
        if why is not None:
            assert f"{label}:{line_no}: " in printed and why in printed, (line_no, printed)


def test_two_value_keypoints_get_the_reference_visibility(tmp_path: Path) -> None:
    yaml_path = _pose_dataset(tmp_path, ["0 0.5 0.5 0.4 0.4 0.4 0.4 -1 0.6"], kpt_shape=[2, 2])
    (rec,), _ = load_split(load_dataset_config(yaml_path), "train", use_cache=False)
    np.testing.assert_allclose(rec.keypoints[0], [[0.4, 0.4, 1], [-1, 0.6, 0]], atol=1e-6)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"kpt_shape": [5]}, "key `kpt_shape` must be [K, D]"),
        ({"kpt_shape": [5, 4]}, "key `kpt_shape` must be [K, D]"),
        ({"kpt_shape": [3, 3], "flip_idx": [0, 1]}, "key `flip_idx` must be a permutation of 0..2"),
        ({"kpt_shape": [3, 3], "flip_idx": [0, 0, 1]}, "key `flip_idx` must be a permutation"),
        ({"flip_idx": [0]}, "key `flip_idx` is set but `kpt_shape` is not"),
    ],
)
def test_bad_keypoint_keys_are_one_line_errors(tmp_path: Path, keys: dict, message: str) -> None:
    yaml_path = _pose_dataset(tmp_path, [], **keys)
    with pytest.raises(DatasetError, match=message.replace("[", r"\[").replace("]", r"\]")) as info:
        load_dataset_config(yaml_path)
    assert str(yaml_path) in str(info.value) and "\n" not in str(info.value)


def test_label_options_write_the_keys_they_read_and_refuse_other_coco_keypoints() -> None:
    """The synthetic writer's yaml keys read back as the same record; COCO names of another K are refused."""
    for options in (LabelOptions(), LabelOptions((2, 3)), LabelOptions((3, 2), (0, 2, 1))):
        assert LabelOptions.from_yaml(options.yaml_keys(), "x.yaml") == options
    filled = LabelOptions((2, 3)).with_keypoint_names(["left_a", "right_a"], (1, 0), "a.json")
    assert filled == LabelOptions((2, 3), (1, 0)) and filled.complete
    with pytest.raises(
        ValueError, match=r"key `kpt_shape` is \[2, 3\] but the categories of a.json declare 3"
    ):
        LabelOptions((2, 3)).with_keypoint_names(["a", "b", "c"], None, "a.json")


def test_packed_records_keep_keypoints_through_select_and_concatenate() -> None:
    rng = np.random.default_rng(0)
    records = [
        ImageRecord(f"/x/{i}.png", 10, 20, np.zeros(n, np.int64), np.full((n, 4), 0.5),
                    keypoints=rng.uniform(0, 1, (n, 3, 3)).astype(np.float32))
        for i, n in enumerate([2, 0, 3])
    ]  # fmt: skip
    packed = PackedRecords(records).with_flip_idx([2, 1, 0])
    for got, want in zip(packed, records):
        np.testing.assert_array_equal(got.keypoints, want.keypoints)
        assert got.flip_idx.tolist() == [2, 1, 0]
    picked = packed.select(np.array([False, True, True]))
    np.testing.assert_array_equal(picked[1].keypoints, records[2].keypoints)
    both = PackedRecords.concatenate([picked, PackedRecords(records[:1])])
    assert both.arrays()["keypoints"].shape == (5, 3, 3) and both.flip_idx.tolist() == [2, 1, 0]
    assert PackedRecords().arrays()["keypoints"].shape == (0, 0, 3)


# ------------------------------------------------------------------------------------------ samples
@pytest.fixture(scope="module")
def pose_yaml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_pose_dataset(tmp_path_factory.mktemp("pose"), num_train=8, num_val=4, image_size=64)


def test_synthetic_pose_set_labels_its_painted_keypoints(pose_yaml: Path) -> None:
    config = load_dataset_config(pose_yaml)
    assert config.options.kpt_shape == SYNTHETIC_KPT_SHAPE and config.options.flip_idx == FLIP_IDX
    records, report = load_split(config, "train", use_cache=False)
    assert report.num_skipped_rows == 0 and records.num_labels() > 8
    visibility = records.arrays()["keypoints"][..., 2]
    assert {0.0, 1.0, 2.0} <= set(np.unique(visibility).tolist())
    rec = records[0]
    image = cv2.imread(rec.path)
    for x, y, v in rec.keypoints.reshape(-1, 3):  # visible keypoints sit on their bright discs
        if v == 2:
            px = image[round(y * rec.height), round(x * rec.width)]
            assert px.min() > 150, (x, y, px)


def test_pose_samples_and_batches(pose_yaml: Path) -> None:
    from yolo11_lightning.data.dataset import BoxDataset
    from yolo11_lightning.tasks import get_task

    task = get_task("pose")
    records, _ = load_split(load_dataset_config(pose_yaml), "train", use_cache=False)
    train = BoxDataset(records, 64, augment=True, task=get_task("pose"), seed=1)
    batch = task.collate([train[(0, i)] for i in range(len(records))])
    n = len(batch["targets"])
    assert batch["keypoints"].shape == (n, K, 3) and n > 0
    labelled = batch["keypoints"][..., 2] > 0
    xy = batch["keypoints"][..., :2][labelled]
    assert ((xy >= 0) & (xy <= 1)).all()
    val = BoxDataset(records, 64, augment=False, task=get_task("pose"))
    sample = val[0]
    rec = records[0]
    scale, (left, top) = sample["scale"], sample["pad"]
    expected = rec.keypoints[..., :2] * [rec.width, rec.height] * scale + [left, top]
    np.testing.assert_allclose(sample["keypoints"][..., :2].numpy() * 64, expected, atol=1e-3)
    assert torch.equal(sample["keypoints"][..., 2], torch.from_numpy(rec.keypoints[..., 2]))
    random.seed(0)


def test_rank_agreement_hashes_the_keypoints(pose_yaml: Path) -> None:
    from yolo11_lightning.data.agreement import record_digests, split_hash
    from yolo11_lightning.data.dataset import BoxDataset

    records, _ = load_split(load_dataset_config(pose_yaml), "val", use_cache=False)
    arrays = records.arrays()
    moved = {**arrays, "keypoints": arrays["keypoints"] + np.float32(0.01)}
    other = PackedRecords.from_arrays(moved)
    same, changed = (
        BoxDataset(records, 64, task=get_task("pose")),
        BoxDataset(other, 64, task=get_task("pose")),
    )
    assert split_hash(same) != split_hash(changed)
    assert record_digests(same) != record_digests(changed)


def test_without_flip_idx_the_flips_are_off(tmp_path: Path) -> None:
    from yolo11_lightning.training.datamodule import YOLODataModule

    yaml_path = _pose_dataset(tmp_path, [r for r, why in POSE_ROWS if why is None], kpt_shape=[2, 3])
    data = YOLODataModule(str(yaml_path), batch_size=2, image_size=64, num_workers=0, pin_memory=False)
    assert data.task == "pose"  # a kpt_shape yaml is a pose dataset
    with pytest.warns(UserWarning, match="no `flip_idx` for its keypoints: fliplr and flipud are off"):
        data.setup("fit")
    assert data.datasets["train"].aug.fliplr == 0.0 and data.aug.fliplr == 0.5


def test_a_batch_without_instances_trains() -> None:
    """Samples without instances (a blank substitute's keypoints do not know K) collate into (0, K, 3) or
    (0, 0, 3) keypoints; the loss takes either for an empty batch."""
    from yolo11_lightning.tasks import get_task
    from yolo11_lightning.tasks.pose.loss import PoseLoss

    def sample(k: int) -> dict:
        return {"image": torch.zeros(3, 64, 64, dtype=torch.uint8), "labels": torch.zeros(0, 5), "index": 0,
                "path": "a", "orig_size": (64, 64), "scale": 1.0, "pad": (0.0, 0.0), "substitute": -1,
                "unreadable": [], "missing": False, "keypoints": torch.zeros(0, k, 3)}  # fmt: skip

    task = get_task("pose")
    assert task.collate([sample(0), sample(5)])["keypoints"].shape == (0, 5, 3)
    blank = task.collate([sample(0), sample(0)])
    maps = [torch.zeros(2, 64 + 1, 64 // s, 64 // s, requires_grad=True) for s in (8, 16, 32)]
    raw = torch.zeros(2, 15, sum((64 // s) ** 2 for s in (8, 16, 32)), requires_grad=True)
    loss, items = PoseLoss(1, (5, 3))((maps, raw), blank["targets"], blank["keypoints"])
    assert torch.isfinite(loss) and items[:3].tolist() == [0, 0, 0]
