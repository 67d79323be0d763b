"""Validation metrics at COCO-val scale: our metric against faster-coco-eval's own evaluation of the same detections.

    python benchmarks/scale/val_scale.py   # boxes: 5,000 images x 80 classes x 300 detections
    python benchmarks/scale/val_scale.py --kinds box mask pose obb --images 1000
    python benchmarks/scale/val_scale.py --kinds box --methods ours old --images 1000   # the torchmetrics metric before

Each (kind, method) runs in a fresh process on the same synthetic load (fixed seed): per image about 7 truths
of 80 classes (a third of them "person"-like class 0, crowded), and 300 detections: 2-6 jittered copies of each
truth (most of its class), the rest background boxes of random classes at low scores. Methods:

- ``ours``: ``DetectionMAP`` (``SegmentationMAP``, ``PoseMAP``, ``ObbMAP``) fed batch by batch as validation
  feeds it (``update``: the per-image matching), then ``compute`` (the accumulation). On N ranks each rank
  matches its own 1/N of the images and accumulates the gathered rows; ``--ranks`` reports that split: the
  largest shard's update time plus the compute.
- ``fce``: faster-coco-eval's ``COCOeval_faster`` from its dicts (the dicts built, loaded, evaluated and
  accumulated: what torchmetrics' conversion hands it, without torchmetrics' second run per class). Boxes and
  masks only (pose and OBB follow the reference validator's rules, not COCO's).
- ``old``: the metric before this change, torchmetrics ``MeanAveragePrecision(class_metrics=True)`` on the
  faster-coco-eval backend (one COCOeval run for all classes, then one per class). Boxes only; slow.

Reported: CPU seconds of the process (``time.process_time``, 1 torch thread), and the peak resident memory
above the process's memory once the load was built (``ru_maxrss``), per method. Prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C  # noqa: F401  (the repo on sys.path, offline oracle)
import numpy as np
import torch

SIZE = 640
CLASSES = 80
BATCH = 32


def load(images: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per image (300, 6) float32 detections ``[x1, y1, x2, y2, score, class]`` and (m, 5) truths (module
    docstring), in pixels of a 640 x 640 image."""
    g = np.random.default_rng(seed)
    out = []
    for _ in range(images):
        m = int(g.poisson(7.3))
        classes = np.where(g.random(m) < 0.3, 0, g.integers(1, CLASSES, m))
        xy, wh = g.uniform(0, 560, (m, 2)), g.uniform(8, 200, (m, 2))
        truths = np.concatenate([xy, np.minimum(xy + wh, SIZE - 1), classes[:, None]], 1)
        copies = np.repeat(np.arange(m), g.integers(2, 7, m))[:300]
        boxes = truths[copies, :4] + g.normal(0, 0.08, (len(copies), 4)) * np.repeat(wh[copies], 2, 1)
        det_classes = np.where(
            g.random(len(copies)) < 0.85, truths[copies, 4], g.integers(0, CLASSES, len(copies))
        )
        scores = g.uniform(0.05, 0.95, len(copies))
        rest = 300 - len(copies)
        bxy, bwh = g.uniform(0, 600, (rest, 2)), g.uniform(4, 120, (rest, 2))
        boxes = np.concatenate([boxes, np.concatenate([bxy, bxy + bwh], 1)])
        det_classes = np.concatenate([det_classes, g.integers(0, CLASSES, rest)])
        scores = np.concatenate([scores, g.uniform(0.001, 0.1, rest)])
        boxes = np.clip(
            np.concatenate(
                [np.minimum(boxes[:, :2], boxes[:, 2:]), np.maximum(boxes[:, :2], boxes[:, 2:]) + 1], 1
            ),
            0,
            SIZE,
        )
        dets = np.concatenate([boxes, scores[:, None], det_classes[:, None]], 1)[np.argsort(-scores)]
        out.append((dets.astype(np.float32), truths.astype(np.float32)))
    return out


def batches(data: list, kind: str):
    """The load as validation batches (unit letterbox) with what each kind's ``update`` takes beside them."""
    from torchvision.ops import box_convert

    for start in range(0, len(data), BATCH):
        chunk = data[start : start + BATCH]
        rows, dets = [], []
        for i, (d, t) in enumerate(chunk):
            t = torch.from_numpy(t)
            dets.append(torch.from_numpy(d))
            cxcywh = box_convert(t[:, :4], "xyxy", "cxcywh") / SIZE
            rows.append(torch.cat((torch.full((len(t), 1), float(i)), t[:, 4:5], cxcywh), 1))
        b = len(chunk)
        batch = {"images": torch.zeros(1, 1, 1, 1, dtype=torch.uint8).expand(b, 3, SIZE, SIZE),
                 "targets": torch.cat(rows), "indices": torch.arange(start, start + b), "scales": torch.ones(b),
                 "pads": torch.zeros(b, 2), "orig_sizes": torch.full((b, 2), SIZE)}  # fmt: skip
        extra = []
        if kind == "mask":
            extra = [[_box_masks(d) for d in dets], [_box_masks(torch.from_numpy(t)) for _, t in chunk]]
        elif kind == "pose":
            # Keypoints at the same places of every box: a detection close to a truth has close keypoints.
            places = torch.rand(17, 2, generator=torch.Generator().manual_seed(0))
            targets = batch["targets"]
            corner = targets[:, None, 2:4] - targets[:, None, 4:6] / 2
            batch["keypoints"] = torch.cat(
                (corner + places * targets[:, None, 4:6], torch.ones(len(targets), 17, 1)), -1
            )
            extra = [[torch.cat((d[:, None, :2] + places * (d[:, None, 2:4] - d[:, None, :2]),
                                 torch.ones(len(d), 17, 1)), -1) for d in dets]]  # fmt: skip
        elif kind == "obb":
            centre = (batch["targets"][:, 2:4] + 0).clone()
            batch["targets"] = torch.cat((batch["targets"], torch.rand(len(centre), 1) - 0.5), 1)
            dets = [torch.cat((box_convert(d[:, :4], "xyxy", "cxcywh"), d[:, 4:6], torch.rand(len(d), 1) - 0.5), 1)
                    for d in dets]  # fmt: skip
        yield dets, batch, extra


def _box_masks(rows: torch.Tensor) -> torch.Tensor:
    """(n, h, w) bool masks at proto resolution (1/4): each box's inside less a corner."""
    side = SIZE // 4
    masks = torch.zeros(len(rows), side, side, dtype=torch.bool)
    for j, (x1, y1, x2, y2) in enumerate((rows[:, :4] / 4).long().tolist()):
        masks[j, y1:y2, x1:x2] = True
        masks[j, y1 : (y1 + y2) // 2, x1 : (x1 + x2) // 2] = False
    return masks


def run_ours(data: list, kind: str, ranks: int) -> dict:
    from yolo11_lightning.metrics.detection import DetectionMAP
    from yolo11_lightning.tasks.obb.metric import ObbMAP
    from yolo11_lightning.tasks.pose.metric import PoseMAP
    from yolo11_lightning.tasks.segment.metric import SegmentationMAP

    metric_class = {"box": DetectionMAP, "mask": SegmentationMAP, "pose": PoseMAP, "obb": ObbMAP}[kind]
    metric = metric_class([str(i) for i in range(CLASSES)])
    updates = []
    for dets, batch, extra in batches(data, kind):  # made lazily: the masks of one batch at a time
        start = time.process_time()
        metric.update(dets, batch, *extra)
        updates.append(time.process_time() - start)
    start = time.process_time()
    result = metric.compute()
    compute = time.process_time() - start
    shard = max(sum(updates[r::ranks]) for r in range(ranks))  # rank r takes every ranks-th batch
    key = {"mask": "mask_mAP50-95", "pose": "pose_mAP50-95"}.get(kind, "mAP50-95")
    return {
        "update": sum(updates),
        "compute": compute,
        "per_rank": shard + compute,
        "map": float(result[key]),
    }


def run_fce(data: list, kind: str) -> dict:
    from faster_coco_eval import COCO, COCOeval_faster
    from pycocotools import mask as mask_utils

    start = time.process_time()
    images, annotations, results = [], [], []
    for i, (d, t) in enumerate(data):
        images.append({"id": i, "height": SIZE, "width": SIZE})
        dm = tm = None
        if kind == "mask":
            dm = _box_masks(torch.from_numpy(d)).numpy()
            tm = _box_masks(torch.from_numpy(t)).numpy()
        for j, row in enumerate(t.tolist()):
            ann = {"id": len(annotations) + 1, "image_id": i, "category_id": int(row[4]), "iscrowd": 0,
                   "bbox": [row[0], row[1], row[2] - row[0], row[3] - row[1]],
                   "area": (row[2] - row[0]) * (row[3] - row[1])}  # fmt: skip
            if tm is not None:
                ann["segmentation"] = mask_utils.encode(np.asfortranarray(tm[j].astype(np.uint8)))
                ann["area"] = float(tm[j].sum())
            annotations.append(ann)
        for j, row in enumerate(d.tolist()):
            res = {"image_id": i, "category_id": int(row[5]), "score": row[4],
                   "bbox": [row[0], row[1], row[2] - row[0], row[3] - row[1]]}  # fmt: skip
            if dm is not None:
                res["segmentation"] = mask_utils.encode(np.asfortranarray(dm[j].astype(np.uint8)))
            results.append(res)
    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO()
        truth.dataset = {"images": images, "annotations": annotations,
                         "categories": [{"id": c, "name": str(c)} for c in range(CLASSES)]}  # fmt: skip
        truth.createIndex()
        evaluation = COCOeval_faster(truth, truth.loadRes(results), "segm" if kind == "mask" else "bbox")
        evaluation.params.maxDets = [1, 10, 300]
        evaluation.evaluate()
        evaluation.accumulate()
    precision = np.asarray(evaluation.eval["precision"])[:, :, :, 0, -1]
    elapsed = time.process_time() - start
    return {
        "update": 0.0,
        "compute": elapsed,
        "per_rank": elapsed,
        "map": float(precision[precision > -1].mean()),
    }


def run_old(data: list, kind: str) -> dict:
    from torchmetrics.detection import MeanAveragePrecision

    start = time.process_time()
    metric = MeanAveragePrecision(box_format="xyxy", iou_type="bbox", class_metrics=True,
                                  backend="faster_coco_eval", max_detection_thresholds=[1, 10, 300])  # fmt: skip
    for d, t in data:
        d, t = torch.from_numpy(d), torch.from_numpy(t)
        metric.update([{"boxes": d[:, :4], "scores": d[:, 4], "labels": d[:, 5].long()}],
                      [{"boxes": t[:, :4], "labels": t[:, 4].long()}])  # fmt: skip
    result = metric.compute()
    elapsed = time.process_time() - start
    return {"update": 0.0, "compute": elapsed, "per_rank": elapsed, "map": float(result["map"])}


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    import yolo11_lightning.tasks.obb.metric
    import yolo11_lightning.tasks.pose.metric
    import yolo11_lightning.tasks.segment.metric  # noqa: F401  (imports are not the metric's memory)

    data = load(args.images)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if args.method == "ours":
        out = run_ours(data, args.kinds[0], args.ranks)
    elif args.method == "fce":
        out = run_fce(data, args.kinds[0])
    else:
        out = run_old(data, args.kinds[0])
    out["peak_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    print("BENCH_RESULT " + json.dumps(out), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--kinds", nargs="+", default=["box"], choices=["box", "mask", "pose", "obb"])
    parser.add_argument("--methods", nargs="+", default=["ours", "fce"], choices=["ours", "fce", "old"])
    parser.add_argument("--ranks", type=int, default=2, help="the split reported for ours")
    parser.add_argument("--method", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.method:
        return worker(args)
    rows = []
    for kind in args.kinds:
        for method in args.methods:
            if method != "ours" and (kind in ("pose", "obb") or (method == "old" and kind != "box")):
                continue
            command = [sys.executable, __file__, "--method", method, "--kinds", kind, "--images", str(args.images),
                       "--ranks", str(args.ranks)]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH_RESULT ")), None)
            if line is None:
                print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
                continue
            result = json.loads(line.split(" ", 1)[1])
            rows.append((kind, method, result))
            print(f"{kind:5} {method:5} {json.dumps(result)}", flush=True)
    print(
        f"\n{args.images} images x {CLASSES} classes x 300 detections, CPU s (1 thread), peak MiB above the load"
    )
    print(
        f"| kind | method | update (s) | compute (s) | total (s) | per rank on {args.ranks} (s) | peak (MiB) | mAP50-95 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for kind, method, r in rows:
        print(f"| {kind} | {method} | {r['update']:.2f} | {r['compute']:.2f} | {r['update'] + r['compute']:.2f} | "
              f"{r['per_rank']:.2f} | {r['peak_mib']:.0f} | {r['map']:.4f} |")  # fmt: skip


if __name__ == "__main__":
    main()
