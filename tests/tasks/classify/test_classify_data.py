"""Classification data: the ImageFolder layout read as records, and the reference's classification pipeline.

The oracle is Ultralytics' ``classify_augmentations`` / ``classify_transforms`` (torchvision v1 transforms on PIL
images); ours runs torchvision v2 on the same PIL images with a per-sample seed (``tasks.classify.augment``).
Evaluation must be pixel-identical; training augmentation is compared in distribution over 2,000 samples per side
(crop area and aspect ratio, flips, erasing), within 5 standard errors.
"""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from yolo11_lightning.data.image_dataset import ImageDataset
from yolo11_lightning.data.sources.config import DatasetError
from yolo11_lightning.data.sources.split import dataset_config, load_split
from yolo11_lightning.tasks import get_task
from yolo11_lightning.tasks.classify.augment import ClassifyAugment, ClassifyTransform

SIDE, OUT, SAMPLES = 256, 64, 2000


def _write(path: Path, image: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), image[..., ::-1])


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train: cat (3 images, one of them corrupt), dog (2), empty (no image); val: cat, dog (1 each)."""
    root = tmp_path_factory.mktemp("folder")
    rng = np.random.default_rng(0)
    shapes = [(40, 60), (70, 50), (64, 64)]
    for i, shape in enumerate(shapes):
        _write(root / "train" / "cat" / f"c{i}.png", rng.integers(0, 256, (*shape, 3), dtype=np.uint8))
    (root / "train" / "cat" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    for i in range(2):
        _write(
            root / "train" / "dog" / f"d{i}.png", rng.integers(0, 256, (50 + 9 * i, 80, 3), dtype=np.uint8)
        )
    (root / "train" / "empty").mkdir()
    _write(root / "val" / "cat" / "v0.png", rng.integers(0, 256, (90, 33, 3), dtype=np.uint8))
    _write(root / "val" / "dog" / "v1.png", rng.integers(0, 256, (31, 77, 3), dtype=np.uint8))
    return root


def test_image_folder_records_classes_and_reports(folder: Path) -> None:
    config = dataset_config(folder)
    assert config.names == ["cat", "dog", "empty"]  # sorted folder names of train, empty ones too (reference)
    assert set(config.splits) == {"train", "val"}
    records, report = load_split(config, "train", use_cache=False, verbose=False)
    assert [Path(r.path).name for r in records] == ["c0.png", "c1.png", "c2.png", "d0.png", "d1.png"]
    assert [int(r.classes[0]) for r in records] == [0, 0, 0, 1, 1]
    assert all(r.boxes.tolist() == [[0.5, 0.5, 1.0, 1.0]] for r in records)
    assert (records[1].height, records[1].width) == (70, 50)
    assert report.num_skipped_images == 1 and any("broken.jpg" in w for w in report.warnings)
    assert any("`empty` has no images" in w for w in report.warnings)
    val, _ = load_split(config, "val", use_cache=True, verbose=False)  # through the label cache
    again, cached = load_split(config, "val", use_cache=True, verbose=False)
    assert cached.from_cache or cached.cache_path
    assert [int(r.classes[0]) for r in again] == [0, 1] == [int(r.classes[0]) for r in val]


def test_check_data_reports_an_image_folder_in_class_labels(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``check-data`` on an ImageFolder root speaks of class labels (the task's ``label_noun``), not of boxes or
    background images; its pictures are the class histogram without a box scatter."""
    from yolo11_lightning.cli import check_data

    args = ["--dataset", str(folder), "--no-cache", "--out", str(tmp_path), "--imgsz", "64", "--samples", "2"]
    assert check_data.main(args) == 0
    printed = capsys.readouterr().out
    assert "train: 5 images, 5 class labels; skipped 1 images" in printed, printed
    assert "box" not in printed and "background" not in printed, printed
    assert {"train_classes.png", "val_classes.png"} <= {p.name for p in tmp_path.iterdir()}
    assert not list(tmp_path.glob("*_boxes.png"))
    assert check_data.main(["--dataset", str(folder), "--no-images", "--no-cache", "--task", "detect"]) == 0
    assert "train: 5 images (0 background), 5 boxes" in capsys.readouterr().out  # a named task's words


def test_a_val_class_missing_from_train_is_an_error(folder: Path, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(folder, root)
    _write(root / "val" / "bird" / "b.png", np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(DatasetError, match=r"val/bird: class folder `bird` of split `val` is not a class"):
        load_split(dataset_config(root), "val", use_cache=False, verbose=False)
    with pytest.raises(DatasetError, match=r"not a classification dataset folder"):
        dataset_config(root / "val" / "bird")


def test_eval_samples_equal_the_reference_transform(folder: Path) -> None:
    """The dataset's evaluation samples (decode, shortest side to 64, centre crop) equal, pixel for pixel, the
    oracle's ``classify_transforms(64)`` on the PIL image of the file, as its ``ClassificationDataset`` reads it."""
    from ultralytics.data.augment import classify_transforms

    config = dataset_config(folder)
    records, _ = load_split(config, "train", use_cache=False, verbose=False)
    ours = ImageDataset(records, OUT, augment=False, task=get_task("classify"))
    oracle = classify_transforms(OUT)
    for i, rec in enumerate(records):
        expected = oracle(Image.fromarray(cv2.cvtColor(cv2.imread(rec.path), cv2.COLOR_BGR2RGB)))
        sample = ours[i]
        assert sample["labels"][0, 0] == rec.classes[0]
        assert torch.equal(sample["image"].float() / 255, expected), rec.path


def _coordinates() -> np.ndarray:
    """A 256 px image whose red channel is the column and green the row: a crop's corners read its box."""
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    return np.stack([x, y, np.full_like(x, 128)], -1).astype(np.uint8)


def _crop_statistics(images: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Per (64, 64, 3) output: the crop's area fraction, log aspect ratio, whether it was flipped."""
    out = {"area": [], "log_ratio": [], "flipped": []}
    for im in images:
        im = im.astype(np.float64)
        left, right = im[:, 0, 0].mean(), im[:, -1, 0].mean()
        top, bottom = im[0, :, 1].mean(), im[-1, :, 1].mean()
        # Pixel centres span (n - 1)/n of a side: the crop's extent is 64/63 of the corner-to-corner distance.
        w, h = abs(right - left) * OUT / (OUT - 1), abs(bottom - top) * OUT / (OUT - 1)
        out["area"].append(w * h / SIDE**2)
        out["log_ratio"].append(math.log(max(w, 1) / max(h, 1)))
        out["flipped"].append(right < left)
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def _oracle_samples(transform, image: np.ndarray, n: int) -> list[np.ndarray]:
    torch.manual_seed(1)
    pil = Image.fromarray(image)
    return [(transform(pil).permute(1, 2, 0).numpy() * 255).round().astype(np.uint8) for _ in range(n)]


def _assert_same_mean(ours: np.ndarray, oracle: np.ndarray, what: str) -> None:
    se = math.sqrt(ours.var() / len(ours) + oracle.var() / len(oracle)) + 1e-12
    assert abs(ours.mean() - oracle.mean()) < 5 * se, (
        f"{what}: ours {ours.mean():.4f}, oracle {oracle.mean():.4f}"
    )


def test_training_crops_and_flips_match_the_reference_in_distribution() -> None:
    """RandomResizedCrop (scale (0.5, 1): the reference trainer's ``1 - scale``, ratio 3/4..4/3) and the flips,
    colour steps off (no auto augment, zero jitter) and no erasing, on both sides."""
    from ultralytics.data.augment import classify_augmentations

    settings = {"scale_jitter": 0.5, "fliplr": 0.5, "flipud": 0.0, "auto_augment": None, "erasing": 0.0}
    ours_t = ClassifyTransform(OUT, ClassifyAugment(**settings, hsv_h=0, hsv_s=0, hsv_v=0))
    oracle_t = classify_augmentations(
        OUT, mean=(0, 0, 0), std=(1, 1, 1), scale=(0.5, 1.0), hflip=0.5, vflip=0.0, auto_augment=None,
        hsv_h=0, hsv_s=0, hsv_v=0, erasing=0.0,
    )  # fmt: skip
    image = _coordinates()
    ours = _crop_statistics([ours_t(image, seed) for seed in range(SAMPLES)])
    oracle = _crop_statistics(_oracle_samples(oracle_t, image, SAMPLES))
    for key in ("area", "log_ratio", "flipped"):
        _assert_same_mean(ours[key], oracle[key], key)
    assert ours["area"].min() > 0.5 - 0.02 and ours["area"].max() < 1.02
    assert abs(ours["log_ratio"]).max() < math.log(4 / 3) + 0.05
    for q in (0.1, 0.5, 0.9):  # the whole distribution, not only its mean
        assert abs(np.quantile(ours["area"], q) - np.quantile(oracle["area"], q)) < 0.03, q


def test_erasing_and_randaugment_rates_match_the_reference() -> None:
    """On a flat grey image: RandomErasing 0.4 alone (the share of samples with an erased, zero, rectangle and
    its area), and RandAugment alone (the share of samples it changed, their mean value), against the oracle's."""
    from ultralytics.data.augment import classify_augmentations

    image = np.full((SIDE, SIDE, 3), 150, np.uint8)
    n = SAMPLES // 2
    common = {"mean": (0, 0, 0), "std": (1, 1, 1), "scale": (0.5, 1.0), "hsv_h": 0, "hsv_s": 0, "hsv_v": 0}
    flat = {"hsv_h": 0, "hsv_s": 0, "hsv_v": 0}
    ours = [ClassifyTransform(OUT, ClassifyAugment(auto_augment=None, **flat))(image, s) for s in range(n)]
    oracle = _oracle_samples(classify_augmentations(OUT, erasing=0.4, **common), image, n)
    zero = [np.stack([(im == 0).all(-1).mean() for im in images]) for images in (ours, oracle)]
    _assert_same_mean(*(z > 0 for z in zero), "erased")
    _assert_same_mean(*zero, "erased area")
    assert 0.33 < (zero[0] > 0).mean() < 0.47

    ours = [ClassifyTransform(OUT, ClassifyAugment(erasing=0.0, **flat))(image, s) for s in range(n)]
    oracle = _oracle_samples(classify_augmentations(OUT, auto_augment="randaugment", **common), image, n)
    changed = [np.stack([(im != 150).any() for im in images]) for images in (ours, oracle)]
    _assert_same_mean(*changed, "changed by RandAugment")
    _assert_same_mean(*(np.stack([im.mean() for im in images]) for images in (ours, oracle)), "mean value")


def test_training_samples_are_a_function_of_seed_epoch_index(folder: Path) -> None:
    records, _ = load_split(dataset_config(folder), "train", use_cache=False, verbose=False)
    data = ImageDataset(records, OUT, augment=True, seed=3, task=get_task("classify"))
    first = data[(1, 2)]["image"]
    assert torch.equal(first, data[(1, 2)]["image"])  # again, after other draws of torch's global generator
    torch.manual_seed(123)
    assert torch.equal(
        first, ImageDataset(records, OUT, augment=True, seed=3, task=get_task("classify"))[(1, 2)]["image"]
    )
    assert not torch.equal(first, data[(2, 2)]["image"])
    assert first.shape == (3, OUT, OUT) and first.dtype == torch.uint8


def test_too_large_images_are_refused_from_their_headers(folder: Path) -> None:
    records, report = load_split(
        dataset_config(folder), "train", use_cache=False, verbose=False, max_image_pixels=3000
    )
    assert [Path(r.path).name for r in records] == ["c0.png"]  # 40 x 60; the others exceed 3000 pixels
    assert report.num_too_large == 4 and any("d1.png" in w for w in report.warnings)


@pytest.mark.parametrize("cache", [True, "disk"])
def test_image_caches_give_the_same_samples(folder: Path, tmp_path: Path, cache: bool | str) -> None:
    """The RAM (node) and disk image caches hold what the loader keeps (shortest side 64): the samples are the
    uncached ones, in training and evaluation."""
    import shutil

    from yolo11_lightning.training.datamodule import YOLODataModule

    root = tmp_path / "data"
    shutil.copytree(folder, root)
    (root / "train" / "cat" / "broken.jpg").unlink()
    modules = []
    for cache_images in (False, cache):
        data = YOLODataModule(
            str(root), batch_size=2, image_size=OUT, num_workers=0, cache_images=cache_images
        )
        data.setup("fit")
        modules.append(data)
    plain, cached = modules
    assert cached.datasets["train"].image_cache is not None
    for key in ("train", "val"):
        for item in ((0, 0), (1, 3), (2, 1)) if key == "train" else (0, 1):
            if key == "val" or item[1] < len(plain.datasets[key]):
                a, b = plain.datasets[key][item], cached.datasets[key][item]
                assert torch.equal(a["image"], b["image"]) and torch.equal(a["labels"], b["labels"]), (
                    key,
                    item,
                )


def test_a_box_dataset_is_refused_for_classification(tmp_path: Path) -> None:
    from yolo11_lightning.errors import UserInputError
    from yolo11_lightning.synthetic.shapes import make_synthetic_dataset
    from yolo11_lightning.training.datamodule import YOLODataModule

    yaml_path = make_synthetic_dataset(tmp_path, num_train=4, num_val=2, image_size=32, min_objects=2)
    data = YOLODataModule(str(yaml_path), task="classify", image_size=OUT, batch_size=2, num_workers=0)
    with pytest.raises(
        UserInputError, match=r"split `train` \(.*\): 4 of 4 images have \d labels, not one class"
    ):
        data.setup("fit")


def test_training_keeps_enough_pixels_for_the_smallest_crop() -> None:
    """Training keeps an image whose shortest side is at most ``load_side`` as it is (crops from the file's own
    pixels, as the reference's), and shrinks a larger one to it: the smallest crop (area 0.5, ratio 3/4) of
    ``load_side`` still spans 64 pixels. Evaluation keeps the shortest side at 64."""
    train, val = ClassifyTransform(OUT, ClassifyAugment()), ClassifyTransform(OUT)
    assert train.load_side == 105 and math.sqrt(0.5 * 3 / 4) * train.load_side >= OUT
    assert train.load_shape(80, 100) == (80, 100) and train.load_shape(300, 400) == (105, 140)
    assert val.load_shape(80, 100) == (64, 80) and val.load_shape(30, 40) == (64, 85)
    image = np.zeros((300, 400, 3), np.uint8)
    assert train.fit(image).shape == (105, 140, 3) and train(train.fit(image), 0).shape == (OUT, OUT, 3)
