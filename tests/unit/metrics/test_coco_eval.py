"""COCO mAP from arrays (``metrics.coco`` through ``DetectionMAP`` / ``SegmentationMAP``) equals pycocotools and
faster-coco-eval on the same detections, per class too (to 1e-12), on adversarial data: crowded images of one
class (the greedy scan), equal scores and identical boxes (COCO's stable orders), images without truths or
without detections, detections of classes that have no truths, a detection limit below the detections per
class; and the value gathered from unpadded shards of 2 ranks equals the single-process one exactly."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch
from torch import Tensor
from torchvision.ops import box_convert

from yolo11_lightning.metrics.detection import DetectionMAP
from yolo11_lightning.tasks.segment.metric import SegmentationMAP

SIZE = 1000  # image side in pixels; every box of these tests stays inside (nothing is clipped)
Image = tuple[
    Tensor, Tensor
]  # (n, 6) detections [x1, y1, x2, y2, score, class], (m, 5) truths [x1..y2, class]


def _images(seed: int, classes: int, count: int = 48, ties: bool = False) -> list[Image]:
    """Truths (up to 24 per image), detections jittered from them (80 % their class), duplicates, false alarms;
    every 7th image without truths, every 5th without detections."""
    g = np.random.default_rng(seed)
    out = []
    for i in range(count):
        m = int(g.integers(0, 25)) if i % 7 else 0
        xy, wh = g.uniform(0, 400, (m, 2)), g.uniform(5, 120, (m, 2))
        truths = np.concatenate([xy, xy + wh, g.integers(0, classes, (m, 1))], 1)
        n = int(g.integers(0, 80)) if i % 5 else 0
        if m:
            source = truths[g.integers(0, m, n)]
            boxes = source[:, :4] + g.normal(0, 6, (n, 4))
            labels = np.where(g.random(n) < 0.8, source[:, 4], g.integers(0, classes + 2, n))
        else:
            boxes, labels = g.uniform(0, 400, (n, 4)), g.integers(0, classes + 2, n)
        boxes = np.concatenate(
            [np.minimum(boxes[:, :2], boxes[:, 2:]), np.maximum(boxes[:, :2], boxes[:, 2:]) + 0.5], 1
        )
        scores = np.round(g.random(n) * 3) / 3 if ties else g.random(n)
        if ties and n > 3:
            boxes[1] = boxes[0]  # identical boxes of equal score
        dets = np.concatenate([boxes, scores[:, None], labels[:, None]], 1)[
            np.argsort(-scores, kind="stable")
        ]
        out.append((torch.tensor(dets, dtype=torch.float32), torch.tensor(truths, dtype=torch.float32)))
    return out


def _batch(images: list[Image], start: int) -> dict[str, Tensor]:
    """A batch as the DataModule makes it: unit letterbox, targets normalised ``[image, class, cx, cy, w, h]``."""
    rows = []
    for i, (_, truths) in enumerate(images):
        cxcywh = box_convert(truths[:, :4], "xyxy", "cxcywh") / SIZE
        rows.append(torch.cat((torch.full((len(truths), 1), float(i)), truths[:, 4:5], cxcywh), 1))
    b = len(images)
    return {
        "images": torch.zeros(1, 1, 1, 1, dtype=torch.uint8).expand(b, 3, SIZE, SIZE),
        "targets": torch.cat(rows),
        "indices": torch.arange(start, start + b),
        "scales": torch.ones(b),
        "pads": torch.zeros(b, 2),
        "orig_sizes": torch.full((b, 2), SIZE),
    }


def _fill(metric: DetectionMAP, images: list[Image], start: int = 0, batch_size: int = 8) -> list[Image]:
    """Update ``metric`` batch by batch; returns what it scored (original pixels) for the COCO tools."""
    scored = []
    for b in range(0, len(images), batch_size):
        chunk = images[b : b + batch_size]
        batch = _batch(chunk, start + b)
        metric.update([d for d, _ in chunk], batch)
        scored += zip(metric.to_original([d for d, _ in chunk], batch), metric.targets_to_original(batch))
    return scored


def _coco_tool(images: list[Image], library: str, max_detections: int, iou_type: str = "bbox", masks=None):
    """(mAP50-95, {class: AP50-95}) by pycocotools or faster-coco-eval from their own dicts: area "all", the
    last detection limit, classes with truths."""
    if library == "pycocotools":
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    else:
        from faster_coco_eval import COCO
        from faster_coco_eval import COCOeval_faster as COCOeval
    from pycocotools import mask as mask_utils

    def rle(mask: Tensor) -> dict:
        encoded = mask_utils.encode(np.asfortranarray(mask.numpy().astype(np.uint8)))
        return {"size": encoded["size"], "counts": encoded["counts"].decode()}

    gt_images, annotations, results, categories = [], [], [], set()
    for i, (dets, truths) in enumerate(images):
        gt_images.append({"id": i, "height": SIZE, "width": SIZE})
        for j, row in enumerate(truths.tolist()):
            xywh = box_convert(torch.tensor([row[:4]]), "xyxy", "xywh")[0].tolist()
            ann = {"id": len(annotations) + 1, "image_id": i, "category_id": int(row[4]), "bbox": xywh,
                   "area": xywh[2] * xywh[3], "iscrowd": 0}  # fmt: skip
            if masks is not None:
                ann["segmentation"] = rle(masks[i][1][j])
                ann["area"] = float(masks[i][1][j].sum())
            annotations.append(ann)
            categories.add(int(row[4]))
        for j, row in enumerate(dets.tolist()):
            xywh = box_convert(torch.tensor([row[:4]]), "xyxy", "xywh")[0].tolist()
            result = {"image_id": i, "category_id": int(row[5]), "bbox": xywh, "score": row[4]}
            if masks is not None:
                result["segmentation"] = rle(masks[i][0][j])
            results.append(result)
            categories.add(int(row[5]))
    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO()
        truth.dataset = {"images": gt_images, "annotations": annotations,
                         "categories": [{"id": c, "name": str(c)} for c in sorted(categories)]}  # fmt: skip
        truth.createIndex()
        evaluation = COCOeval(truth, truth.loadRes(results), iou_type)
        evaluation.params.maxDets = [1, min(10, max_detections), max_detections]
        evaluation.evaluate()
        evaluation.accumulate()
    precision = np.asarray(evaluation.eval["precision"])[:, :, :, 0, -1]
    per_class = {}
    for k, c in enumerate(evaluation.params.catIds):
        valid = precision[:, :, k][precision[:, :, k] > -1]
        if valid.size:
            per_class[int(c)] = float(valid.mean())
    valid = precision[precision > -1]
    return float(valid.mean()) if valid.size else -1.0, per_class


@pytest.mark.parametrize(
    ("seed", "classes", "ties", "max_detections"),
    [(0, 2, False, 300), (1, 2, True, 300), (2, 3, True, 7), (3, 80, False, 300), (4, 4, False, 12)],
)
def test_box_map_equals_pycocotools_and_faster_coco_eval_per_class(
    seed: int, classes: int, ties: bool, max_detections: int
) -> None:
    metric = DetectionMAP(max_detections=max_detections)
    scored = _fill(metric, _images(seed, classes, ties=ties))
    ours = metric.compute()
    for library in ("pycocotools", "faster_coco_eval"):
        expected, per_class = _coco_tool(scored, library, max_detections)
        assert 0.02 < expected < 0.98
        assert ours["mAP50-95"].item() == pytest.approx(expected, abs=1e-12), library
        assert {k: v.item() for k, v in ours.items() if k.startswith("AP/")} == pytest.approx(
            {f"AP/{c}": ap for c, ap in per_class.items()}, abs=1e-12
        ), library  # the classes with truths, no more (a class only detected has no AP)


def test_mask_map_equals_pycocotools_per_class() -> None:
    """Masks: boxes of the images above, each box's mask its inside with random holes (empty masks included)."""
    images = _images(5, 3, count=16)
    g = torch.Generator().manual_seed(0)
    side = SIZE // 8
    masks = []
    for dets, truths in images:
        pair = []
        for rows in (dets, truths):
            grid = torch.zeros(len(rows), side, side, dtype=torch.bool)
            for j, (x1, y1, x2, y2) in enumerate((rows[:, :4] / 8).round().long().tolist()):
                grid[j, y1:y2, x1:x2] = True
            grid &= torch.rand(grid.shape, generator=g) > 0.03
            grid[: len(rows) // 5] = False  # some empty masks
            pair.append(grid)
        masks.append(tuple(pair))
    metric = SegmentationMAP()
    scored = []
    for b in range(0, len(images), 4):
        chunk = images[b : b + 4]
        batch = _batch(chunk, b)
        metric.update(
            [d for d, _ in chunk], batch, [m[0] for m in masks[b : b + 4]], [m[1] for m in masks[b : b + 4]]
        )
        scored += zip(metric.to_original([d for d, _ in chunk], batch), metric.targets_to_original(batch))
    ours = metric.compute()
    expected, per_class = _coco_tool(scored, "pycocotools", 300, "segm", masks)
    assert 0.02 < expected < 0.98
    assert ours["mask_mAP50-95"].item() == pytest.approx(expected, abs=1e-12)
    assert {k: v.item() for k, v in ours.items() if k.startswith("mask_AP/")} == pytest.approx(
        {f"mask_AP/{c}": ap for c, ap in per_class.items()}, abs=1e-12
    )


def test_two_ranks_equal_one_rank_exactly_and_an_empty_rank_sends_its_shape() -> None:
    """Rank 0 holds 29 images in batches of 8, rank 1 the other 19 in batches of 5 (unpadded shards): the gathered
    rows give the single-process values bit for bit (torchmetrics' ``_sync_dist``, the collective replaced by its
    result on rank 0; real 2-rank runs are in the DDP tests)."""
    images = _images(6, 3, ties=True)
    single = DetectionMAP(reference_style=True)
    _fill(single, images)
    expected = single.compute()
    rank0, rank1 = DetectionMAP(reference_style=True), DetectionMAP(reference_style=True)
    _fill(rank0, images[:29])
    _fill(rank1, images[29:], start=29, batch_size=5)
    sent: list[Tensor] = []
    rank1._sync_dist(lambda t, group=None: sent.append(t) or [t])
    rank0._sync_dist(lambda t, group=None: [t, sent.pop(0)])
    assert not sent
    gathered = rank0.compute()
    assert set(gathered) == set(expected) and "mAP50-95_reference_style" in gathered
    for key, value in expected.items():
        assert gathered[key].item() == value.item(), key
    empty = DetectionMAP()
    empty._sync_dist(lambda t, group=None: [t, t])  # a rank that saw no batch sends (0, width) states
    with pytest.warns(UserWarning):  # torchmetrics: compute before update
        assert empty.compute()["mAP50-95"] == -1  # COCO's "no data"


def _rank_main(rank: int, init_file: str, results: dict) -> None:
    """One of 2 gloo ranks: score its unpadded shard (rank 0: images 0-28, rank 1: 29-47) and compute."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        images = _images(6, 3, ties=True)
        metric = DetectionMAP(reference_style=True)
        metric.keep_evaluation = rank == 0
        if rank == 0:
            _fill(metric, images[:29])
        else:
            _fill(metric, images[29:], start=29, batch_size=5)
        values = {k: v.item() for k, v in metric.compute().items()}
        kept = metric.evaluation
        results[rank] = (values, None if kept is None else kept.kinds["box"].ap.tolist())
    finally:
        dist.destroy_process_group()


def test_two_real_gloo_ranks_share_the_classes_and_equal_one_process(tmp_path) -> None:
    """Two processes, a real gloo group: each rank accumulates its share of the classes, one all-reduce makes the
    per-class arrays whole; both ranks get the single-process values exactly, rank 0 the per-class results."""
    import torch.multiprocessing as mp

    single = DetectionMAP(reference_style=True)
    single.keep_evaluation = True
    _fill(single, _images(6, 3, ties=True))
    expected = {k: v.item() for k, v in single.compute().items()}
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_rank_main, args=(str(tmp_path / "init"), results), nprocs=2, start_method="fork")
        results = dict(results)
    for rank in (0, 1):
        assert results[rank][0] == expected, rank
    assert results[0][1] == single.evaluation.kinds["box"].ap.tolist() and results[1][1] is None
