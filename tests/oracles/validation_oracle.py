"""Validation against the reference validator (AGPL, test oracle only): data, weights, both runs, scoring.

Used by ``test_validation_parity.py`` and ``benchmarks/parity/val_parity.py``:

- ``write_dataset``: PNG/JPEG images of several aspect ratios (enlarged and shrunk at 160 px) in YOLO layout;
- ``informative_weights``: a reference yolo11n whose BatchNorm statistics are measured on the images and
  whose class bias puts a few hundred (anchor, class) pairs per image above 0.001, so detections have
  distinct scores and boxes (a random network gives near-identical image-sized boxes, where NMS turns
  float noise into different survivors); ``labels_from_detections`` then makes ground truth near its best
  detections so the mAP is far from 0;
- ``oracle_detections`` / ``our_detections``: per-image detections in original pixels, COCO json style;
- ``coco_map``: pycocotools mAP50-95 of such detections; ``match_detections``: one-to-one comparison.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("YOLO_OFFLINE", "1")

import numpy as np
import torch
from data_files import pattern, write_image, write_labels, write_yaml

# (height, width): wide, tall and square, shrunk and enlarged at 160 px; one JPEG (the decoder path).
IMAGE_SIZES = [
    (100, 240),
    (90, 160),
    (120, 200),
    (150, 230),
    (130, 130),
    (240, 180),
    (70, 50),
    (160, 96),
    (200, 110),
]
NAMES = {0: "a", 1: "b", 2: "c"}


def write_dataset(
    root: Path, labels: dict[str, list[str]] | None = None, images_from: Path | None = None
) -> Path:
    """Images (or copies of ``images_from``'s) and labels (default: one box each) in YOLO layout; the yaml."""
    for i, (h, w) in enumerate(IMAGE_SIZES):
        name = f"{i}.jpg" if i == 3 else f"{i}.png"
        target = root / "images" / "val" / name
        if images_from is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(images_from / "images" / "val" / name, target)
        else:
            write_image(target, pattern(h, w, seed=i))
        write_labels(root / "labels" / "val" / f"{i}.txt", (labels or {}).get(str(i), ["0 0.5 0.5 0.4 0.4"]))
    return write_yaml(
        root / "data.yaml", {"path": str(root), "train": "images/val", "val": "images/val", "names": NAMES}
    )


def informative_weights(
    yaml: Path, out: Path, image_size: int = 160, candidates: int = 300, seed: int = 0
) -> Path:
    """A reference yolo11n with measured BN statistics and a tuned class bias, saved like a release."""
    from model_oracle import save_like_release
    from torch import nn
    from ultralytics.nn.tasks import DetectionModel

    from yolo11_lightning import YOLODataModule

    data = YOLODataModule(
        dataset=str(yaml), batch_size=16, image_size=image_size, num_workers=0, rect_val=False
    )
    data.setup("validate")
    x = torch.cat([b["images"].float() / 255 for b in data.val_dataloader()])
    torch.manual_seed(seed)
    model = DetectionModel("yolo11n.yaml", nc=len(NAMES), verbose=False)
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    with torch.no_grad():
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # one pass, cumulative average
        model.train()
        model(x)
        model.eval()
        heads = [branch[-1] for branch in model.model[-1].cv3]
        for head in heads:
            head.bias.zero_()
        logits = torch.logit(model(x)[0][:, 4:].double().clamp(1e-12, 1 - 1e-12))
        share = candidates / logits[0].numel()
        bias = float(torch.logit(torch.tensor(0.001, dtype=torch.float64)) - logits.quantile(1 - share))
        for head in heads:
            head.bias.fill_(bias)
    return save_like_release(model, out, NAMES)


def labels_from_detections(
    detections: list[dict[str, Any]], per_image: int = 3, seed: int = 0
) -> dict[str, list[str]]:
    """YOLO label lines near the ``per_image`` best detections of each image (a few pixels of jitter)."""
    rng = np.random.default_rng(seed)
    sizes = {str(i): hw for i, hw in enumerate(IMAGE_SIZES)}
    out: dict[str, list[str]] = defaultdict(list)
    for det in sorted(detections, key=lambda d: -d["score"]):
        key = str(det["image_id"])
        if len(out[key]) >= per_image:
            continue
        h, w = sizes[key]
        x, y, bw, bh = np.array(det["bbox"]) + rng.normal(0, 2, 4)
        x, y = max(x, 0.0), max(y, 0.0)
        bw, bh = min(max(bw, 4.0), w - x), min(max(bh, 4.0), h - y)
        out[key].append(
            f"{det['category_id'] - 1} {(x + bw / 2) / w:.6f} {(y + bh / 2) / h:.6f} {bw / w:.6f} {bh / h:.6f}"
        )
    return dict(out)


def oracle_detections(
    weights: Path,
    yaml: Path,
    rect: bool,
    workdir: Path,
    image_size: int = 160,
    batch: int = 3,
    fuse: bool = True,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The reference ``DetectionValidator``'s saved detections (its predictions.json) and its metrics."""
    from ultralytics.models.yolo.detect import DetectionValidator

    model = torch.load(weights, weights_only=False)["model"].float()
    if not fuse:
        model.fuse = lambda verbose=True: model
    name = f"oracle_{'rect' if rect else 'square'}"
    validator = DetectionValidator(
        args={"data": str(yaml), "imgsz": image_size, "batch": batch, "rect": rect, "plots": False,
              "save_json": True, "workers": 0, "device": "cpu", "half": False, "conf": 0.001, "iou": 0.7,
              "max_det": 300, "project": str(workdir), "name": name, "exist_ok": True, "verbose": False}
    )  # fmt: skip
    stats = validator(model=model)
    return json.loads((workdir / name / "predictions.json").read_text()), stats


def our_detections(
    weights: Path, yaml: Path, rect: bool, image_size: int = 160, batch: int = 3, **module_options: Any
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Our ``Trainer.validate``'s detections in original pixels (json style) and its logged metrics."""
    import lightning as L

    from yolo11_lightning import YOLO11Module, YOLODataModule

    data = YOLODataModule(
        dataset=str(yaml), batch_size=batch, image_size=image_size, num_workers=0, rect_val=rect
    )
    module = YOLO11Module(
        scale="n", num_classes=data.num_classes, class_names=data.class_names, weights=str(weights), log_images=0,
        **module_options,
    )  # fmt: skip
    out: list[dict[str, Any]] = []

    class Collect(L.Callback):
        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            for path, det in zip(batch["paths"], pl_module.val_map.to_original(outputs["detections"], batch)):
                for x1, y1, x2, y2, score, cls in det.tolist():
                    out.append({"image_id": int(Path(path).stem), "category_id": int(cls) + 1,
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "score": score})  # fmt: skip

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Collect()])  # fmt: skip
    metrics = trainer.validate(module, data, verbose=False)[0]
    return out, metrics


def coco_ground_truth(yaml: Path) -> dict[str, Any]:
    """COCO-format ground truth (original pixels) of ``write_dataset``'s labels."""
    root = yaml.parent
    images, annotations = [], []
    for i, (h, w) in enumerate(IMAGE_SIZES):
        images.append({"id": i, "height": h, "width": w, "file_name": str(i)})
        for line in (root / "labels" / "val" / f"{i}.txt").read_text().split("\n"):
            if not line.strip():
                continue
            c, cx, cy, bw, bh = (float(v) for v in line.split())
            box = [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h]
            annotations.append({"id": len(annotations) + 1, "image_id": i, "category_id": int(c) + 1,
                                "bbox": box, "area": box[2] * box[3], "iscrowd": 0})  # fmt: skip
    categories = [{"id": k + 1, "name": v} for k, v in NAMES.items()]
    return {"images": images, "annotations": annotations, "categories": categories}


def coco_map(ground_truth: dict[str, Any], detections: list[dict[str, Any]]) -> float:
    """pycocotools mAP50-95 (COCOeval ``stats[0]``) of json-style detections."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = json.loads(json.dumps(ground_truth))
        gt.createIndex()
        dt = gt.loadRes([{k: d[k] for k in ("image_id", "category_id", "bbox", "score")} for d in detections])
        ev = COCOeval(gt, dt, "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return float(ev.stats[0])


def match_detections(
    reference: list[dict[str, Any]],
    ours: list[dict[str, Any]],
    box_tol: float = 0.01,
    score_tol: float = 1e-4,
) -> tuple[list[str], float, float, int]:
    """One-to-one match per image (same class, every coordinate within ``box_tol`` px, score within ``score_tol``).

    Returns (problems: one line per image whose detections do not all pair up, worst box difference,
    worst score difference over the pairs, number of pairs).
    """
    by_image: dict[int, list[list[dict[str, Any]]]] = defaultdict(lambda: [[], []])
    for side, dets in enumerate((reference, ours)):
        for d in dets:
            by_image[int(d["image_id"])][side].append(d)
    problems, worst_box, worst_score, pairs = [], 0.0, 0.0, 0
    for image, (ref, mine) in sorted(by_image.items()):
        used = np.zeros(len(mine), bool)
        boxes = np.array([d["bbox"] for d in mine]).reshape(-1, 4)
        scores = np.array([d["score"] for d in mine])
        classes = np.array([d["category_id"] for d in mine])
        unmatched = 0
        for d in sorted(ref, key=lambda d: -d["score"]):
            diff = np.abs(boxes - np.array(d["bbox"])).max(1) if len(mine) else np.zeros(0)
            ok = (
                (~used)
                & (classes == d["category_id"])
                & (np.abs(scores - d["score"]) <= score_tol)
                & (diff <= box_tol)
            )
            if not ok.any():
                unmatched += 1
                continue
            j = int(np.flatnonzero(ok)[diff[ok].argmin()])
            used[j] = True
            pairs += 1
            worst_box, worst_score = (
                max(worst_box, float(diff[j])),
                max(worst_score, abs(scores[j] - d["score"])),
            )
        if unmatched or not used.all():
            problems.append(f"image {image}: {len(ref)} reference detections, {len(mine)} ours, "
                            f"{unmatched} of the reference's without a match")  # fmt: skip
    return problems, worst_box, worst_score, pairs
