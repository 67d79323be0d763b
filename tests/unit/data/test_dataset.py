"""BoxDataset and collate: the batch contract, exact letterbox metadata, determinism across workers."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from yolo11_lightning.data.augment.pipeline import AugmentConfig
from yolo11_lightning.data.dataset import BoxDataset
from yolo11_lightning.data.images import cache as image_cache_module
from yolo11_lightning.data.images.cache import ImageCache, estimate_cache_bytes
from yolo11_lightning.data.rect_batches import eval_resized_shape
from yolo11_lightning.data.sampling.sampler import ElasticDistributedSampler, epoch_order
from yolo11_lightning.data.sampling.seeds import partner_stride
from yolo11_lightning.data.sources.packed_records import PackedRecords
from yolo11_lightning.structures.batch import collate_detection
from yolo11_lightning.structures.records import ImageRecord

SIZE = 96


def write_records(folder, n: int = 8, seed: int = 0) -> list[ImageRecord]:
    """n PNGs of random sizes, each with one rectangle of class = its index and one of class n (shared)."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        h, w = (int(v) for v in rng.integers(40, 150, 2))
        img = rng.integers(0, 60, (h, w, 3), dtype=np.uint8)
        boxes = []
        for _ in range(2):
            bw, bh = int(rng.integers(w // 5, w // 2)), int(rng.integers(h // 5, h // 2))
            x1, y1 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            img[y1 : y1 + bh, x1 : x1 + bw] = rng.integers(120, 255, 3)
            boxes.append([(x1 + bw / 2) / w, (y1 + bh / 2) / h, bw / w, bh / h])
        path = folder / f"img{i}.png"
        cv2.imwrite(str(path), img[..., ::-1])
        records.append(ImageRecord(str(path), h, w, [i, n], boxes))
    records.append(ImageRecord(str(folder / "img0.png"), records[0].height, records[0].width))  # background
    return records


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return write_records(tmp_path_factory.mktemp("images"))


def test_batch_contract(records):
    for augment in (True, False):
        dataset = BoxDataset(records, SIZE, augment=augment, seed=1)
        batch = collate_detection([dataset[(2, i)] for i in (0, 3, 8)])  # 8: background image, no labels
        assert set(batch) == {"images", "targets", "targets_per_image", "indices", "orig_sizes", "scales", "pads",
                              "paths", "substitutes", "substituted", "unreadable", "missing"}  # fmt: skip
        assert (
            batch["substitutes"].tolist() == [-1, -1, -1]
            and batch["unreadable"] == []
            and not batch["missing"]
        )
        assert batch["images"].dtype == torch.uint8 and batch["images"].shape == (3, 3, SIZE, SIZE)
        # Stored channels-last (OpenCV's HWC, the detector's default layout): no transpose anywhere.
        assert batch["images"].is_contiguous(memory_format=torch.channels_last)
        t = batch["targets"]
        assert t.dtype == torch.float32 and t.ndim == 2 and t.shape[1] == 6
        assert set(t[:, 0].tolist()) <= {0.0, 1.0, 2.0} and len(t) > 0
        assert augment or 2.0 not in t[:, 0], "the background image has no targets when not mixed"
        assert ((t[:, 2:] >= 0) & (t[:, 2:] <= 1)).all()
        assert batch["indices"].dtype == torch.int64 and batch["indices"].tolist() == [0, 3, 8]
        assert batch["orig_sizes"].dtype == torch.int64 and batch["orig_sizes"].shape == (3, 2)
        assert batch["orig_sizes"][1].tolist() == [records[3].height, records[3].width]
        assert batch["scales"].dtype == torch.float32 and batch["scales"].shape == (3,)
        assert batch["pads"].dtype == torch.float32 and batch["pads"].shape == (3, 2)
        assert batch["paths"] == [records[i].path for i in (0, 3, 8)]
        assert torch.isnan(batch["scales"]).all() == augment  # no inverse mapping for augmented images
    assert len(dataset[8]["labels"]) == 0 and dataset[8]["labels"].shape == (0, 5)


@pytest.mark.parametrize("scaleup", [True, False])
def test_val_letterbox_metadata_maps_boxes_back_to_original_pixels(records, scaleup):
    dataset = BoxDataset(records, SIZE, augment=False, scaleup=scaleup)
    for i in range(len(records) - 1):
        sample = dataset[i]
        rec = records[i]
        scale, (left, top) = sample["scale"], sample["pad"]
        assert sample["image"].shape == (3, SIZE, SIZE)
        if not scaleup:
            assert scale <= 1.0
        xywh = sample["labels"][:, 1:].numpy() * SIZE
        xyxy = np.concatenate([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], 1)
        back = (xyxy - [left, top, left, top]) / scale
        wh = np.array([rec.width, rec.height, rec.width, rec.height])
        original = np.concatenate(
            [rec.boxes[:, :2] - rec.boxes[:, 2:] / 2, rec.boxes[:, :2] + rec.boxes[:, 2:] / 2], 1
        )
        np.testing.assert_allclose(back, original * wh, atol=1e-3)
        # The padding is grey and the picture sits where the metadata says.
        img = sample["image"].permute(1, 2, 0).numpy()
        # The reference validator's short side: rounded up (data.rect_batches), so w * scale may be off by one.
        inner_h, inner_w, _ = eval_resized_shape(rec.height, rec.width, SIZE, scaleup)
        assert (img[: int(top)] == 114).all() and (img[:, : int(left)] == 114).all()
        assert (img[int(top) + inner_h :] == 114).all() and (img[:, int(left) + inner_w :] == 114).all()


def test_same_sample_with_0_and_2_workers(records):
    dataset = BoxDataset(
        records, SIZE, augment=True, aug=AugmentConfig(mixup=0.5), seed=4, global_batch_size=4
    )
    batches = []
    for workers in (0, 2):
        sampler = ElasticDistributedSampler(dataset, 4, seed=4)
        sampler.set_epoch(3)
        loader = DataLoader(
            dataset, batch_size=4, sampler=sampler, num_workers=workers, collate_fn=collate_detection
        )
        batches.append(list(loader))
    assert len(batches[0]) == len(batches[1]) == 3
    for a, b in zip(*batches):
        assert a["images"].numpy().tobytes() == b["images"].numpy().tobytes()
        assert torch.equal(a["targets"], b["targets"]) and torch.equal(a["indices"], b["indices"])


def test_int_index_is_epoch_0_and_epochs_differ(records):
    dataset = BoxDataset(records, SIZE, augment=True, seed=0)
    assert torch.equal(dataset[2]["image"], dataset[(0, 2)]["image"])
    assert not torch.equal(dataset[(0, 2)]["image"], dataset[(1, 2)]["image"])
    with pytest.raises(IndexError):
        dataset[len(records)]


def test_mosaic_switches_off_from_mosaic_until_epoch(records):
    n = len(records) - 1
    dataset = BoxDataset(records, SIZE, augment=True, seed=0, mosaic_until_epoch=2, global_batch_size=None)
    own = [{float(i), float(n)} for i in range(n)]
    foreign_before = foreign_after = 0
    for epoch in (0, 1, 2, 3):
        for i in range(n):
            classes = set(dataset[(epoch, i)]["labels"][:, 0].tolist())
            if epoch < 2:
                foreign_before += not classes <= own[i]
            else:
                foreign_after += not classes <= own[i]
    assert foreign_before > n // 2, "mosaic should bring other images' objects in"
    assert foreign_after == 0, "after mosaic_until_epoch each sample shows only its own image"


def test_mosaic_partners_come_from_the_global_batch(records):
    n, pool = len(records) - 1, 4
    dataset = BoxDataset(records[:n], SIZE, augment=True, seed=2, global_batch_size=pool)
    order = epoch_order(n, 2, 5, pool)
    for b in range(0, len(order), pool):
        members = {float(i) for i in order[b : b + pool]} | {float(n)}
        for i in order[b : b + pool]:
            assert set(dataset[(5, int(i))]["labels"][:, 0].tolist()) <= members


def test_record_size_mismatch_names_the_file(records):
    rec = records[0]
    bad = ImageRecord(rec.path, rec.height + 1, rec.width, rec.classes, rec.boxes)
    dataset = BoxDataset([bad], SIZE, augment=False, read_attempts=1)
    with pytest.raises(ValueError, match=r"img0\.png: decoded size .* differs from the record's"):
        dataset.load_resized(0)
    sample = dataset[0]  # evaluation: the image is left out, with the reason
    assert sample["missing"] and "differs from the record's" in sample["unreadable"][0][1]


def test_ram_cache_gives_identical_samples_and_refuses_when_too_big(records, monkeypatch):
    plain = BoxDataset(records, SIZE, augment=True, seed=3)
    cached = BoxDataset(records, SIZE, augment=True, seed=3)
    cached.image_cache = ImageCache.build(records, SIZE, lambda i: plain.load_resized(i)[0], num_threads=2)
    assert cached.image_cache.image_bytes == estimate_cache_bytes(records, SIZE)
    for key in [(0, 1), (1, 5), (2, 8)]:
        assert torch.equal(plain[key]["image"], cached[key]["image"])
        assert torch.equal(plain[key]["labels"], cached[key]["labels"])
    monkeypatch.setattr(image_cache_module, "available_memory_bytes", lambda: 1000)
    with pytest.raises(MemoryError, match="cache_images"):
        ImageCache.build(records, SIZE, lambda i: plain.load_resized(i)[0])


@pytest.mark.parametrize(("global_batch", "stride"), [(16, 1), (64, 4), (128, 8)])
def test_partner_pools_stay_on_one_rank_for_world_sizes_dividing_the_stride(global_batch, stride):
    n = 300
    records = [ImageRecord(f"/nowhere/{i}.jpg", 10, 10) for i in range(n)]  # pools need no pixels
    dataset = BoxDataset(records, SIZE, augment=True, seed=1, global_batch_size=global_batch)
    assert partner_stride(global_batch) == stride
    order = epoch_order(n, 1, 2, global_batch)
    wrapped = set(order[n:].tolist())  # padding repeats these: their pool comes from their first position
    for world in (w for w in (1, 2, 4, 8) if stride % w == 0):
        per_rank = global_batch // world
        for rank in range(world):
            sampler = ElasticDistributedSampler(range(n), global_batch, num_replicas=world, rank=rank, seed=1)
            sampler.set_epoch(2)
            items = [i for _, i in sampler]
            for b in range(0, len(items), per_rank):
                device_batch = set(items[b : b + per_rank])
                for i in device_batch - wrapped:
                    pool = dataset.partner_pool(2, i)
                    assert len(pool) >= min(16, global_batch) and i in pool
                    assert set(pool.tolist()) <= device_batch, "a partner lives on another rank or batch"


def test_packed_records_round_trip(records):
    odd = [*records, ImageRecord("/data/été/ünïcode.jpg", 3, 4, [2], [[0.5, 0.5, 0.2, 0.2]])]
    packed = PackedRecords(odd)
    assert len(packed) == len(odd)
    for rec, got in zip(odd, (packed[i] for i in range(len(packed)))):
        assert (got.path, got.height, got.width) == (rec.path, rec.height, rec.width)
        np.testing.assert_array_equal(got.classes, rec.classes)
        np.testing.assert_array_equal(got.boxes, rec.boxes)
    assert len(PackedRecords([])) == 0


def test_per_axis_eval_gain_maps_boxes_back_exactly(records):
    """eval_box_gain="per_axis": scale = (w'/w, h'/h), and the letterbox inverse undoes each axis on its own."""
    from yolo11_lightning.ops.letterbox import letterbox_to_original

    dataset = BoxDataset(records, SIZE, augment=False, eval_box_gain="per_axis")
    anisotropic = 0
    for i in range(len(records) - 1):
        sample, rec = dataset[i], records[i]
        new_h, new_w, _ = eval_resized_shape(rec.height, rec.width, SIZE)
        assert sample["scale"] == pytest.approx((new_w / rec.width, new_h / rec.height))
        anisotropic += sample["scale"][0] != sample["scale"][1]
        xywh = sample["labels"][:, 1:] * SIZE
        xyxy = torch.cat((xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2), 1)
        back = letterbox_to_original(
            xyxy,
            torch.tensor(sample["scale"]),
            torch.tensor(sample["pad"]),
            torch.tensor([rec.height, rec.width]),
        )
        original = np.concatenate(
            [rec.boxes[:, :2] - rec.boxes[:, 2:] / 2, rec.boxes[:, :2] + rec.boxes[:, 2:] / 2], 1
        ) * np.array([rec.width, rec.height, rec.width, rec.height])
        np.testing.assert_allclose(back.numpy(), original.clip(0, [rec.width, rec.height] * 2), atol=1e-3)
    assert anisotropic, "no image whose two axes were resized by different factors: the test would be vacuous"
    with pytest.raises(ValueError, match="eval_box_gain"):
        BoxDataset(records, SIZE, eval_box_gain="both")
