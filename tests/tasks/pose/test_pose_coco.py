"""COCO keypoints json as a pose dataset: the records equal those of the YOLO pose rows the oracle's converter
(``ultralytics.data.converter.convert_coco(use_keypoints=True)``, a test oracle only) writes from the same json,
``kpt_shape`` and ``flip_idx`` follow from the categories' keypoint names, bad annotations are named by json and
annotation id, and a pose model trains on such a json end to end.

Tolerance of the comparison with the converter: 1e-6 absolute on normalised coordinates. The converter writes
``%g`` (6 significant digits: at most 5e-7 off for a value in [0.1, 1), less below), and the records hold float32
(6e-8 near 1).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")  # before any import of the reference package

import lightning as L
import numpy as np
import pytest
import torch
import yaml
from data_files import pattern, write_image, write_yaml

from yolo11_lightning.cli import check_data
from yolo11_lightning.cli.lightning_cli import YOLOLightningCLI
from yolo11_lightning.data.sources.config import DatasetError, flip_from_names, load_dataset_config
from yolo11_lightning.data.sources.split import load_split
from yolo11_lightning.synthetic.poses import FLIP_IDX, SYNTHETIC_KPT_SHAPE
from yolo11_lightning.synthetic.shapes import make_synthetic_dataset
from yolo11_lightning.training.datamodule import YOLODataModule
from yolo11_lightning.training.module import YOLO11Module

ATOL = 1e-6  # module docstring
SIZES = [(64, 64), (48, 64), (64, 40), (64, 64), (56, 64)]  # (h, w) per image; image 3 has no annotation


def _oracle_coco_pose() -> dict:
    import ultralytics

    path = Path(ultralytics.__file__).parent / "cfg" / "datasets" / "coco-pose.yaml"
    return yaml.safe_load(path.read_text())


def _annotations(
    rng: np.random.Generator, image_id: int, h: int, w: int, k: int, first_id: int
) -> list[dict]:
    """2-3 persons or robots of random boxes inside the image, K keypoints inside each box with visibility
    0/1/2 (v = 0 written 0, 0, 0 as COCO does, but one kept where it was: both are kept as written)."""
    out = []
    for j in range(int(rng.integers(2, 4))):
        bw, bh = rng.uniform(8, w / 2), rng.uniform(8, h / 2)
        x, y = rng.uniform(1, w - bw - 1), rng.uniform(1, h - bh - 1)
        points = np.stack([rng.uniform(x, x + bw, k), rng.uniform(y, y + bh, k), rng.integers(0, 3, k)], 1)
        unlabelled = points[:, 2] == 0
        if j:
            points[unlabelled, :2] = 0.0
        out.append(
            {
                "id": first_id + j, "image_id": image_id, "category_id": int(rng.integers(1, 3)), "iscrowd": 0,
                "bbox": [x, y, bw, bh], "area": bw * bh, "keypoints": points.reshape(-1).tolist(),
                "num_keypoints": int((~unlabelled).sum()),
            }
        )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """(COCO yaml without kpt_shape, YOLO yaml of the oracle's converted rows, the oracle's coco-pose yaml): 5
    images of up to 64 px, 17 COCO keypoints, two categories, a crowd annotation and a background image."""
    from ultralytics.data.converter import convert_coco

    oracle = _oracle_coco_pose()
    names = oracle["kpt_names"][0]
    root = tmp_path_factory.mktemp("pose_coco")
    rng = np.random.default_rng(0)
    images, annotations = [], []
    for i, (h, w) in enumerate(SIZES):
        write_image(root / "coco" / "images" / f"img{i}.png", pattern(h, w, seed=i))
        images.append({"id": i + 1, "file_name": f"img{i}.png", "width": w, "height": h})
        if i != 3:
            annotations += _annotations(rng, i + 1, h, w, len(names), 100 * (i + 1))
    crowd = {**annotations[0], "id": 999, "iscrowd": 1}
    categories = [{"id": 1, "name": "person", "keypoints": names, "skeleton": [[16, 14], [14, 12]]},
                  {"id": 2, "name": "robot", "keypoints": names}]  # fmt: skip
    json_path = root / "coco" / "person_keypoints_train.json"
    json_path.write_text(
        json.dumps({"images": images, "annotations": [*annotations, crowd], "categories": categories})
    )
    coco_yaml = write_yaml(root / "coco" / "data.yaml", {"train": json_path.name, "val": json_path.name})

    convert_coco(str(root / "coco"), str(root / "yolo"), use_keypoints=True, cls91to80=False)
    yolo_images = root / "yolo" / "images" / json_path.stem
    shutil.copytree(root / "coco" / "images", yolo_images, dirs_exist_ok=True)
    assert len(list((root / "yolo" / "labels" / json_path.stem).glob("*.txt"))) == 4  # not the background
    keys = {"names": ["person", "robot"], "kpt_shape": [17, 3], "flip_idx": oracle["flip_idx"]}
    yolo_yaml = write_yaml(
        root / "yolo" / "data.yaml", {"train": str(yolo_images), "val": str(yolo_images), **keys}
    )
    return coco_yaml, yolo_yaml, oracle


def test_coco_keypoints_json_gives_the_records_of_the_oracles_converted_rows(converted) -> None:
    coco_yaml, yolo_yaml, oracle = converted
    coco, yolo = load_dataset_config(coco_yaml), load_dataset_config(yolo_yaml)
    # kpt_shape from the categories' 17 keypoint names, flip_idx from their left_/right_ pairs: the reference's
    assert coco.options.kpt_shape == yolo.options.kpt_shape == (17, 3) and coco.names == yolo.names
    assert coco.options.flip_idx == tuple(oracle["flip_idx"]) == flip_from_names(oracle["kpt_names"][0])
    ours, report = load_split(coco, "train", use_cache=False)
    theirs, yolo_report = load_split(yolo, "train", use_cache=False)
    assert report.warnings == yolo_report.warnings == [] and report.num_crowd == 1
    assert (
        [Path(r.path).name for r in ours]
        == [Path(r.path).name for r in theirs]
        == [f"img{i}.png" for i in range(5)]
    )
    assert ours.flip_idx.tolist() == theirs.flip_idx.tolist() == oracle["flip_idx"]
    visibilities = set()
    for a, b in zip(ours, theirs):
        assert (a.height, a.width) == (b.height, b.width)
        np.testing.assert_array_equal(a.classes, b.classes)
        np.testing.assert_allclose(a.boxes, b.boxes, rtol=0, atol=ATOL)
        assert a.keypoints.shape == b.keypoints.shape == (len(a.classes), 17, 3)
        np.testing.assert_allclose(a.keypoints, b.keypoints, rtol=0, atol=ATOL)
        np.testing.assert_array_equal(a.keypoints[..., 2], b.keypoints[..., 2])
        visibilities |= set(a.keypoints[..., 2].ravel().tolist())
    assert visibilities == {0.0, 1.0, 2.0} and ours.num_labels() == theirs.num_labels() > 8
    unlabelled = ours.arrays()["keypoints"][..., 2] == 0
    assert (ours.arrays()["keypoints"][unlabelled][:, 0] > 0).any()  # v = 0 keeps its coordinates as written


def test_names_give_flip_idx_only_when_every_side_pairs() -> None:
    assert flip_from_names(["head", "Left_Hand", "right_hand"]) == (0, 2, 1)
    assert flip_from_names(["head", "tail"]) is None  # nothing to swap: no flip_idx, the flips are off
    assert flip_from_names(["left_eye", "right_ear"]) is None  # a side without its partner
    assert flip_from_names(["left_eye", "right_eye", "left_eye"]) is None


BAD = [  # (keypoints of a K = 2 annotation in a 64 x 64 image, the reason it is refused), None: missing
    ([10, 10, 2, 20, 20, 1, 5], "keypoints has 7 values, expected 6"),
    ([10, math.nan, 2, 20, 20, 1], "keypoint value is not a finite number"),
    ([10, 10, 3, 20, 20, 1], "keypoint 0 has visibility 3, not 0, 1 or 2"),
    (None, "no `keypoints` (the dataset's kpt_shape is [2, 3])"),
    ([10, 10, 2, 200, 20, 1], "keypoint 1 at (3.125, 0.3125) is outside the image"),
    (["10", 10, 2, 20, 20, 1], "keypoints must be a list of numbers"),
]


def test_bad_coco_keypoints_are_named_by_json_and_annotation_id(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    write_image(tmp_path / "images" / "a.png", pattern(64, 64))
    good = {"image_id": 1, "category_id": 7, "bbox": [4, 4, 40, 40], "iscrowd": 0}
    annotations = [{**good, "id": 10, "keypoints": [10, 10, 2, 0, 0, 0]}]
    for i, (points, _) in enumerate(BAD):
        annotations.append({**good, "id": 11 + i, "bbox": [4 + i, 4, 40, 40]})
        if points is not None:
            annotations[-1]["keypoints"] = points
    json_path = tmp_path / "kp.json"
    json_path.write_text(
        json.dumps(
            {
                "images": [{"id": 1, "file_name": "a.png", "width": 64, "height": 64}],
                "annotations": annotations,
                "categories": [{"id": 7, "name": "hand", "keypoints": ["left_eye", "right_eye"]}],
            }
        )
    )
    yaml_path = write_yaml(tmp_path / "d.yaml", {"train": "kp.json", "val": "kp.json"})
    (rec,), report = load_split(load_dataset_config(yaml_path), "train", use_cache=False)
    np.testing.assert_allclose(rec.keypoints, [[[10 / 64, 10 / 64, 2], [0, 0, 0]]], atol=1e-7)
    assert report.num_skipped_rows == len(BAD)
    assert check_data.main(["--dataset", str(yaml_path), "--no-images", "--no-cache"]) == 0
    printed = capsys.readouterr().out
    for i, (_, why) in enumerate(BAD):
        assert f"warning: {json_path}: annotation id {11 + i}: {why}" in printed, printed

    # A yaml kpt_shape other than the categories' [2, 3] is one line naming the yaml and the json.
    for shape in ([3, 3], [2, 2]):
        write_yaml(yaml_path, {"train": "kp.json", "val": "kp.json", "kpt_shape": shape})
        with pytest.raises(DatasetError) as info:
            load_dataset_config(yaml_path)
        message = str(info.value)
        assert f"key `kpt_shape` is {shape}" in message and str(json_path) in message and "\n" not in message


@pytest.fixture(scope="module")
def synthetic_pose_coco(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic pose set of 8 train / 4 val images of 64 px, with its COCO keypoints json."""
    root = tmp_path_factory.mktemp("synthetic_pose_coco")
    make_synthetic_dataset(root, 8, 4, 64, num_classes=3, task="pose", coco=True)
    return root


def test_synthetic_pose_json_gives_the_records_of_its_yolo_rows(synthetic_pose_coco: Path) -> None:
    coco = load_dataset_config(synthetic_pose_coco / "coco.yaml")
    yolo = load_dataset_config(synthetic_pose_coco / "data.yaml")
    assert (
        (coco.options.kpt_shape, coco.options.flip_idx)
        == (yolo.options.kpt_shape, yolo.options.flip_idx)
        == (SYNTHETIC_KPT_SHAPE, FLIP_IDX)
    )
    for split in ("train", "val"):
        ours, report = load_split(coco, split, use_cache=False)
        theirs, _ = load_split(yolo, split, use_cache=False)
        assert report.warnings == [] and [r.path for r in ours] == [r.path for r in theirs]
        for a, b in zip(ours, theirs):
            np.testing.assert_array_equal(a.classes, b.classes)
            np.testing.assert_allclose(a.boxes, b.boxes, rtol=0, atol=ATOL)  # rows written with 8 decimals
            np.testing.assert_allclose(a.keypoints, b.keypoints, rtol=0, atol=ATOL)


def test_a_pose_model_trains_on_a_coco_keypoints_json(synthetic_pose_coco: Path, tmp_path: Path) -> None:
    dataset = str(synthetic_pose_coco / "coco.yaml")
    # The CLI's model takes the kpt_shape the json's categories give (its yaml has none).
    model_args = {"kpt_shape": None, "task": "pose"}

    class Namespace(dict):
        __getattr__, __setattr__ = dict.__getitem__, dict.__setitem__

    model_ns = Namespace(model_args)
    YOLOLightningCLI._follow_kpt_shape(model_ns, dataset)
    assert model_ns.kpt_shape == list(SYNTHETIC_KPT_SHAPE)

    torch.manual_seed(0)
    model = YOLO11Module(scale="n", num_classes=3, task="pose", kpt_shape=model_ns.kpt_shape, log_images=0)
    data = YOLODataModule(dataset, batch_size=4, image_size=64, num_workers=0, pin_memory=False)
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path, callbacks=[],
    )  # fmt: skip
    trainer.fit(model, datamodule=data)
    assert data.task == "pose" and data.datasets["train"].aug.fliplr == 0.5  # flip_idx from the names
    metrics = trainer.callback_metrics
    assert all(math.isfinite(float(metrics[f"train/{k}_loss"])) for k in ("box", "pose", "kobj")), metrics
    assert {"val/pose_mAP50-95", "val/mAP50-95"} <= set(metrics), sorted(metrics)

    # A model of another kpt_shape is refused in one line, as on YOLO pose rows.
    other = YOLO11Module(scale="n", num_classes=3, task="pose", kpt_shape=[17, 3], log_images=0)
    data = YOLODataModule(dataset, batch_size=4, image_size=64, num_workers=0, pin_memory=False)
    with pytest.raises(DatasetError) as info:
        L.Trainer(
            accelerator="cpu",
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            default_root_dir=tmp_path,
        ).fit(other, datamodule=data)
    message = str(info.value)
    assert "has kpt_shape [5, 3] but the model's kpt_shape is [17, 3]" in message and "\n" not in message


def test_a_box_run_on_a_coco_keypoints_json_says_that_pose_would_train_them(
    synthetic_pose_coco: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The json is a box dataset too, so detection trains on it; the log says what is left out, once."""
    data = YOLODataModule(str(synthetic_pose_coco / "coco.yaml"), batch_size=4, image_size=64, num_workers=0,
                          pin_memory=False, task="detect")  # fmt: skip
    with caplog.at_level(logging.INFO):
        data.setup("fit")
    hints = [r.getMessage() for r in caplog.records if "--model.task pose" in r.getMessage()]
    assert len(hints) == 1 and "kpt_shape [5, 3]" in hints[0] and "coco.yaml" in hints[0], hints
    caplog.clear()
    pose = YOLODataModule(str(synthetic_pose_coco / "coco.yaml"), batch_size=4, image_size=64, num_workers=0,
                          pin_memory=False, task="pose")  # fmt: skip
    with caplog.at_level(logging.INFO):
        pose.setup("fit")
    assert not [r for r in caplog.records if "--model.task pose" in r.getMessage()]
