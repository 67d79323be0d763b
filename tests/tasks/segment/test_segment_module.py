"""YOLO11Module(task="segment"): training step, box + mask mAP, predict with masks, the CLI's task check (its 2-rank
fit: tests/tasks/segment/test_segment_resume.py).

Hand-made 64 px ``SegmentationBatch``es (``collate_segmentation`` of crafted samples); a fake segmenter whose
output is the ground truth gives the metric a known answer (mask mAP 1.0, or 0.0 with empty masks).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import cv2
import lightning as L
import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from yolo11_lightning.cli.lightning_cli import YOLOLightningCLI
from yolo11_lightning.model_files.weights import load_model
from yolo11_lightning.tasks.segment.batch import collate_segmentation
from yolo11_lightning.tasks.segment.metric import SegmentationMAP, mask_iou
from yolo11_lightning.training.callbacks.closing_summary import ClosingSummary
from yolo11_lightning.training.callbacks.result_pictures import ResultPictures
from yolo11_lightning.training.module import YOLO11Module

SIZE = 64
NUM_CLASSES = 3
# Per sample: instances as (class, x1, y1, x2, y2) in 1/4-resolution mask pixels (16 x 16 masks), largest first.
INSTANCES = [
    [(1, 2, 3, 12, 11), (0, 9, 9, 14, 15)],
    [(2, 1, 1, 8, 6)],
    [(0, 4, 2, 15, 14), (2, 0, 10, 5, 16), (1, 10, 0, 16, 4)],
]


def _sample(index: int, overlap: bool) -> dict:
    """A sample of the dataset contract: image, labels [class, cx, cy, w, h] (normalised) and its masks.

    Each instance is its box minus a corner notch, so a mask is not just its box.
    """
    g = torch.Generator().manual_seed(index)
    instances = INSTANCES[index % len(INSTANCES)]
    side = SIZE // 4
    masks = torch.zeros(len(instances), side, side, dtype=torch.uint8)
    labels = []
    for k, (cls, x1, y1, x2, y2) in enumerate(instances):
        masks[k, y1:y2, x1:x2] = 1
        masks[k, y1, x1] = 0  # the notch
        labels.append([cls, (x1 + x2) / 2 / side, (y1 + y2) / 2 / side, (x2 - x1) / side, (y2 - y1) / side])
    if overlap:  # index map: k-th row -> k + 1, later (smaller) rows drawn over earlier ones
        index_map = torch.zeros(side, side, dtype=torch.uint8)
        for k in range(len(instances)):
            index_map[masks[k] == 1] = k + 1
        masks = index_map
    return {
        "image": torch.randint(0, 255, (3, SIZE, SIZE), dtype=torch.uint8, generator=g),
        "labels": torch.tensor(labels, dtype=torch.float32),
        "index": index,
        "orig_size": (SIZE, SIZE),
        "scale": 1.0,
        "pad": (0.0, 0.0),
        "path": f"img{index}.jpg",
        "masks": masks,
    }


class SampleList(torch.utils.data.Dataset):
    def __init__(self, count: int, overlap: bool, start: int = 0) -> None:
        self.samples = [_sample(start + i, overlap) for i in range(count)]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict:
        return self.samples[i]


def loader(count: int = 4, overlap: bool = True, batch_size: int = 2, start: int = 0) -> DataLoader:
    return DataLoader(
        SampleList(count, overlap, start), batch_size=batch_size, collate_fn=collate_segmentation
    )


class SegData(L.LightningDataModule):
    """Hand-made batches behind the DataModule attributes the recipe reads (global ``batch_size``)."""

    def __init__(self, overlap: bool, batch_size: int = 2) -> None:
        super().__init__()
        self.batch_size, self.overlap = batch_size, overlap

    def train_dataloader(self) -> DataLoader:
        return loader(overlap=self.overlap, batch_size=self.batch_size)


def trainer(root: Path, **kwargs) -> L.Trainer:
    options = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                   default_root_dir=str(root))  # fmt: skip
    return L.Trainer(**{**options, **kwargs})


def seg_module(**kwargs) -> YOLO11Module:
    options = dict(task="segment", num_classes=NUM_CLASSES, optimizer="SGD", warmup_epochs=0.0, nominal_batch=2,
                   ema=False, log_images=0)  # fmt: skip
    return YOLO11Module(**{**options, **kwargs})


class GradientProbe(L.Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.grads = {
            n: p.grad.detach().clone() for n, p in pl_module.model.named_parameters() if p.grad is not None
        }


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[YOLO11Module, GradientProbe, dict, Path]:
    """One optimiser step on hand-made per-instance-mask batches; the module, its gradients, the logged values
    and a Lightning checkpoint of it."""
    root = tmp_path_factory.mktemp("seg_fit")
    torch.manual_seed(0)
    module, probe = seg_module(), GradientProbe()
    run = trainer(root, max_steps=1, limit_val_batches=0, callbacks=[probe])
    run.fit(module, datamodule=SegData(overlap=False))
    path = root / "seg.ckpt"
    run.save_checkpoint(path)
    return module, probe, dict(run.callback_metrics), path


def test_training_step_finite_loss_and_gradients_to_every_head_weight(fitted) -> None:
    module, probe, metrics, _ = fitted
    for name in ("box", "seg", "cls", "dfl"):
        value = metrics[f"train/{name}_loss"]
        assert torch.isfinite(value) and value > 0, (name, value)
    head = {n: p for n, p in module.model.named_parameters() if n.startswith("head.") and p.requires_grad}
    assert any(n.startswith("head.proto.") for n in head) and any(n.startswith("head.cv4.") for n in head)
    for name in head:
        grad = probe.grads.get(name)
        assert grad is not None, f"{name}: no gradient"
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0, f"{name}: zero or non-finite gradient"


def test_segment_checkpoint_carries_task(fitted) -> None:
    _, _, _, path = fitted
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    assert checkpoint["hyper_parameters"]["task"] == "segment"
    model = load_model(path, task=None)
    assert model.task == "segment" and model.num_classes == NUM_CLASSES
    with pytest.raises(ValueError, match="segmentation model"):
        load_model(path, task="detect")  # callers that handle detection only are told what the file holds
    assert YOLO11Module.load_from_checkpoint(path).task.name == "segment"


class FakeSegmenter(nn.Module):
    """Eval output of a segmenter that reproduces the batch it is given: one anchor per target, box and class
    exact, mask coefficient k = 1 for instance k, protos = the ground-truth masks as logits (+1 in, -1 out)."""

    def __init__(self, mask_sign: float = 1.0) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))  # a device for Lightning
        self.batch: dict | None = None
        self.mask_sign = mask_sign

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor]:
        from yolo11_lightning.tasks.segment.mask_ops import image_target_masks

        batch = self.batch
        assert batch is not None
        b, (h, w) = len(images), images.shape[-2:]
        targets = batch["targets"]
        anchors = max(int((targets[:, 0] == i).sum()) for i in range(b))
        predictions = torch.zeros(b, 4 + NUM_CLASSES + 32, max(anchors, 1))
        protos = torch.full((b, 32, h // 4, w // 4), -1.0)
        for i in range(b):
            rows = targets[targets[:, 0] == i]
            gt = image_target_masks(batch["masks"], batch["mask_overlap"], targets, i)
            for k, row in enumerate(rows):
                predictions[i, :4, k] = row[2:6] * torch.tensor([w, h, w, h])
                predictions[i, 4 + int(row[1]), k] = 0.9
                predictions[i, 4 + NUM_CLASSES + k, k] = 1.0
                protos[i, k] = torch.where(gt[k], 1.0, -1.0) * self.mask_sign
        return predictions, protos


class PerfectSegmenter(YOLO11Module):
    def validation_step(self, batch, batch_idx):
        self.model.batch = batch
        return super().validation_step(batch, batch_idx)


def test_validation_logs_mask_map_one_for_perfect_masks_and_draws_them(tmp_path: Path) -> None:
    module = PerfectSegmenter(
        task="segment", num_classes=NUM_CLASSES, ema=False, log_images=2, channels_last=False
    )
    module.model = FakeSegmenter()
    summary = ClosingSummary()
    metrics = trainer(tmp_path, callbacks=[ResultPictures(), summary]).validate(
        module, loader(count=5, overlap=True), verbose=False
    )[0]
    for name in ("mAP50-95", "mAP50", "mask_mAP50-95", "mask_mAP50"):
        assert metrics[f"val/{name}"] == pytest.approx(1.0), (name, metrics)
    drawn = cv2.imread(str(tmp_path / "val_images" / "epoch_000.png"))
    assert drawn is not None and drawn.shape == (SIZE, 2 * SIZE, 3)
    # The closing summary and the result pictures have the mask results beside the box results.
    table = {row["class"]: row for row in csv.DictReader((tmp_path / "summary_validate.csv").open())}
    for column in ("box_P", "box_R", "box_mAP50-95", "mask_P", "mask_R", "mask_mAP50", "mask_mAP50-95"):
        assert float(table["all"][column]) == pytest.approx(1.0), (column, table["all"])
    assert "mask_mAP50-95" in summary.last_text
    for kind in ("box", "mask"):
        for curve in ("PR", "F1", "P", "R"):
            image = cv2.imread(str(tmp_path / "pictures" / "val" / f"{kind}_{curve}_curve.png"))
            assert image is not None and image.std() > 10, (kind, curve)


def test_background_images_in_a_validation_batch_score_like_the_others(tmp_path: Path) -> None:
    """An image without instances (no truths, hence no detections from the perfect segmenter) beside normal
    ones: validation runs and the mAPs stay 1 (it used to fail reshaping its (0, h, w) masks)."""
    background = _sample(1, overlap=True)
    background.update(labels=torch.zeros(0, 5), masks=torch.zeros(SIZE // 4, SIZE // 4, dtype=torch.uint8))
    samples = [_sample(0, overlap=True), background, _sample(2, overlap=True)]
    batches = DataLoader(samples, batch_size=3, collate_fn=collate_segmentation)
    module = PerfectSegmenter(
        task="segment", num_classes=NUM_CLASSES, ema=False, log_images=0, channels_last=False
    )
    module.model = FakeSegmenter()
    metrics = trainer(tmp_path).validate(module, batches, verbose=False)[0]
    for name in ("mAP50-95", "mask_mAP50-95"):
        assert metrics[f"val/{name}"] == pytest.approx(1.0), (name, metrics)
    assert metrics["val/fitness"] == pytest.approx(2.0)  # box + mask, each 0.1 * mAP50 + 0.9 * mAP50-95


def test_mask_map_scores_the_masks_not_the_boxes() -> None:
    """Same boxes, masks that miss (the protos' sign flipped, masks outside the instance): box mAP 1, mask mAP 0."""
    module = seg_module(channels_last=False).eval()
    module.model = FakeSegmenter(mask_sign=-1.0)
    metric = SegmentationMAP()
    for batch in loader(count=3, overlap=False):
        module.model.batch = batch
        module.task.evaluate(module, batch, metric)
    result = metric.compute()
    assert result["mAP50-95"] == pytest.approx(1.0)
    assert result["mask_mAP50"] < 0.05


def _fill(metric: SegmentationMAP, batches: DataLoader, sign: float = 1.0) -> None:
    """Noisy predictions (masks with a few flipped pixels, jittered scores) so the mAP is neither 0 nor 1."""
    module = seg_module(channels_last=False).eval()
    module.model = FakeSegmenter()
    for batch in batches:
        module.model.batch = batch
        predictions, protos = module.model(batch["images"])
        g = torch.Generator().manual_seed(int(batch["indices"][0]))
        protos = protos * torch.where(torch.rand(protos.shape, generator=g) < 0.15, -1.0, 1.0)
        rows = module.task.nms(module, predictions)
        from yolo11_lightning.tasks.segment.mask_ops import image_target_masks, masks_at_protos

        masks = [masks_at_protos(protos[i], r[:, 6:], r[:, :4], (SIZE, SIZE)) for i, r in enumerate(rows)]
        truths = [image_target_masks(batch["masks"], batch["mask_overlap"], batch["targets"], i)
                  for i in range(len(rows))]  # fmt: skip
        metric.update([r[:, :6] for r in rows], batch, masks, truths)


def test_distributed_mask_map_equals_single_process_with_unpadded_shards() -> None:
    """Rank 0 holds 4 images, rank 1 holds 3 (unpadded): the gathered states give the single-process value.

    The gather is torchmetrics' own ``_sync_dist`` with the collective replaced by its result on rank 0
    (``[rank 0's tensor, rank 1's tensor]`` per state); a real 2-rank gloo run is the CLI test below.
    """
    single = SegmentationMAP()
    _fill(single, loader(count=7, overlap=True, batch_size=2))
    expected = single.compute()
    assert 0.05 < expected["mask_mAP50-95"] < 0.95

    rank0, rank1 = SegmentationMAP(), SegmentationMAP()
    _fill(rank0, loader(count=4, overlap=True, batch_size=2))
    _fill(rank1, loader(count=3, overlap=True, batch_size=2, start=4))
    sent: list[Tensor] = []
    rank1._sync_dist(lambda t, group=None: sent.append(t) or [t])  # what rank 1 contributes, state by state
    rank0._sync_dist(lambda t, group=None: [t, sent.pop(0)])  # rank 0's view of the gather: [rank 0, rank 1]
    assert not sent
    gathered = rank0.compute()
    for key in ("mAP50-95", "mAP50", "mask_mAP50-95", "mask_mAP50", "mask_mAP75"):
        assert gathered[key] == expected[key], key


def test_mask_iou_is_cocos_on_empty_and_overlapping_masks() -> None:
    """The IoU the mask matching reads equals pycocotools' RLE IoU, bit for bit: random, full, empty (0 against
    anything, also against an empty mask) and identical masks."""
    from pycocotools import mask as mask_utils

    g = torch.Generator().manual_seed(0)
    masks = torch.rand(6, 7, 9, generator=g) > 0.5
    masks[0], masks[1], masks[2] = True, False, masks[3]
    truths = torch.cat((masks[[1, 3]], torch.rand(2, 7, 9, generator=g) > 0.3))
    encode = lambda m: mask_utils.encode(np.asfortranarray(m.numpy().transpose(1, 2, 0).astype(np.uint8)))  # noqa: E731
    expected = mask_utils.iou(encode(masks), encode(truths), [0] * len(truths)).T  # (truths, detections)
    np.testing.assert_array_equal(mask_iou(truths, masks), expected)
    assert mask_iou(truths[:0], masks).shape == (0, 6)


def test_predict_step_masks_in_original_image_size() -> None:
    """A 48 x 40 (h x w) image letterboxed to 64: masks come back at 48 x 40, inside the original boxes."""
    module = seg_module(channels_last=False).eval()
    module.model = FakeSegmenter()
    scale, pad = 64 / 48, ((64 - 40 * 64 / 48) / 2, 0.0)
    # One instance filling the middle of the letterboxed image: box x 24..44, y 16..44 px (input).
    index_map = torch.zeros(16, 16, dtype=torch.uint8)
    index_map[4:11, 6:11] = 1
    module.model.batch = {"targets": torch.tensor([[0, 1, 0.53125, 0.46875, 0.3125, 0.4375]]), "masks": index_map[None],
                          "mask_overlap": True}  # fmt: skip
    batch = {"images": torch.zeros(1, 3, SIZE, SIZE, dtype=torch.uint8), "orig_sizes": torch.tensor([[48, 40]]),
             "scales": torch.tensor([scale]), "pads": torch.tensor([pad]), "paths": ["a.jpg"]}  # fmt: skip
    with torch.no_grad():
        (out,) = module.predict_step(batch, 0)
    assert out["detections"].shape == (1, 6) and out["masks"].shape == (1, 48, 40)
    x1, y1, x2, y2 = out["detections"][0, :4].tolist()
    ys, xs = out["masks"][0].nonzero(as_tuple=True)
    assert len(ys) and xs.min() >= x1 - 2 and xs.max() <= x2 + 1 and ys.min() >= y1 - 2 and ys.max() <= y2 + 1


def test_predict_source_on_a_seg_checkpoint_writes_rle(fitted, tmp_path: Path) -> None:
    from faster_coco_eval.core import mask as mask_utils

    from yolo11_lightning.predict.command import main
    from yolo11_lightning.predict.writer import RESULTS_JSON

    _, _, _, path = fitted
    images = tmp_path / "images"
    images.mkdir()
    g = np.random.default_rng(0)
    cv2.imwrite(str(images / "a.png"), g.integers(0, 255, (50, 70, 3), dtype=np.uint8))
    out = tmp_path / "out"
    code = main(["--ckpt_path", str(path), "--source", str(images), "--out", str(out), "--conf", "0.001",
                 "--image-size", str(SIZE), "--device", "cpu"])  # fmt: skip
    assert code == 0
    rows = json.loads((out / RESULTS_JSON).read_text())
    assert rows, "no detection at conf 0.001"
    for row in rows:
        rle = row["segmentation"]
        assert rle["size"] == [50, 70] and isinstance(rle["counts"], str)
        decoded = mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()})
        assert decoded.shape == (50, 70) and decoded.any()
    assert (out / "a.png").is_file()


def test_cli_refuses_model_and_data_of_different_tasks() -> None:
    cli = SimpleNamespace(datamodule=SimpleNamespace(task="detect"), model=seg_module())
    with pytest.raises(ValueError, match=r"model.task='segment' but data.task='detect'"):
        YOLOLightningCLI.check_task(cli)  # type: ignore[arg-type]
    cli.datamodule.task = "segment"
    YOLOLightningCLI.check_task(cli)  # type: ignore[arg-type]
    YOLOLightningCLI.check_task(
        SimpleNamespace(datamodule=object(), model=cli.model)
    )  # no data task: no check


def test_cli_parses_model_task(tiny_dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from yolo11_lightning.cli.main import main

    with pytest.raises(SystemExit) as stop:
        main(["fit", "--model.task", "segment", "--data.dataset", str(tiny_dataset), "--print_config"])
    assert stop.value.code in (0, None)
    assert "task: segment" in capsys.readouterr().out


def test_an_image_without_instances_rasterises_to_an_empty_index_map() -> None:
    """Augmentation can leave no polygon in an image (mosaic crops, affine): training must go on."""
    from yolo11_lightning.tasks.segment.masks import rasterize

    index_map, order = rasterize([], 64, 48, overlap=True)
    assert index_map.shape == (16, 12) and not index_map.any() and len(order) == 0
