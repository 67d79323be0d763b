"""Instance-segmentation mAP: ``DetectionMAP``'s box mAP plus mask mAP, exact across ranks."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor
from torchmetrics.detection import MeanAveragePrecision

from yolo11_lightning.training.metrics.class_results import match_at_half
from yolo11_lightning.training.metrics.detection import DetectionMAP

__all__ = ["SegmentationMAP", "decode_runs", "mask_iou", "mask_runs"]

# Extra flat states (width 0: 1-D int64): per detection / truth row its mask's run count, in the order the rows
# were added; every mask's runs, in the same order; per image [image, mask height, mask width].
_MASK_STATES = {"det_counts": 0, "truth_counts": 0, "det_runs": 0, "truth_runs": 0, "mask_sizes": 3}


def mask_runs(masks: Tensor) -> list[np.ndarray]:
    """(n, h, w) bool -> per mask its column-major run lengths, starting with a (possibly empty) run of zeros
    (COCO's uncompressed RLE): a few hundred integers instead of h·w pixels."""
    n, h, w = masks.shape
    flat = (
        masks.detach().transpose(1, 2).reshape(n, h * w).cpu().numpy().astype(bool)
    )  # n = 0: an empty image
    out = []
    for m in flat:
        changes = np.flatnonzero(m[1:] != m[:-1]) + 1
        runs = np.diff(np.concatenate(([0], changes, [m.size])))
        out.append(np.concatenate(([0], runs)) if m.size and m[0] else runs)
    return out


def decode_runs(runs: Tensor, counts: Tensor, height: int, width: int) -> Tensor:
    """Inverse of ``mask_runs``: flat ``runs`` holding ``counts[i]`` runs for mask i -> (n, h, w) bool."""
    position = torch.arange(len(runs)) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    flat = torch.repeat_interleave(position % 2 == 1, runs)  # odd runs are the ones
    return flat.reshape(len(counts), width, height).transpose(1, 2)


def mask_iou(truths: Tensor, detections: Tensor) -> Tensor:
    """(m, h, w) and (n, h, w) bool masks -> (m, n) float IoU."""
    a = truths.reshape(len(truths), -1).float()
    b = detections.reshape(len(detections), -1).float()
    inter = a @ b.T
    union = a.sum(1)[:, None] + b.sum(1)[None, :] - inter
    return inter / union.clamp(min=1)


class SegmentationMAP(DetectionMAP):
    """Box mAP (``DetectionMAP``, original pixels) and mask mAP (``mask_mAP50-95``, ``mask_mAP50``, ...).

    Masks are scored as the reference validator scores them: the predicted masks at proto resolution
    (``tasks.segment.mask_ops.masks_at_protos``, 1/4 of the letterboxed input) against the batch's ground-truth masks at the
    same resolution (``tasks.segment.mask_ops.image_target_masks``), by ``MeanAveragePrecision(iou_type="segm")``
    (faster-coco-eval). Masks are kept as run lengths in flat ``cat`` states beside the box rows, gathered with
    them and evaluated in dataset-index order: the distributed value equals the single-process value exactly.
    """

    def __init__(
        self, class_names: list[str] | None = None, max_detections: int = 300, **kwargs: Any
    ) -> None:
        super().__init__(class_names, max_detections, **kwargs)
        self._widths.update(_MASK_STATES)
        for name in _MASK_STATES:
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(  # type: ignore[override]
        self, detections: list[Tensor], batch: dict[str, Any], masks: list[Tensor], truth_masks: list[Tensor]
    ) -> None:
        """Add one batch: per image (n, 6) detections in letterboxed-input pixels, their (n, h, w) bool masks,
        and the (m, h, w) bool ground-truth masks (one per target row of the image, in order)."""
        truth_counts = torch.bincount(batch["targets"][:, 0].long(), minlength=len(detections)).tolist()
        for i, (det, mask, truth) in enumerate(zip(detections, masks, truth_masks)):
            if len(mask) != len(det) or len(truth) != truth_counts[i]:
                raise ValueError(
                    f"image {i}: {len(mask)} masks for {len(det)} detections, {len(truth)} ground-truth masks "
                    f"for {truth_counts[i]} targets"
                )
        super().update(detections, batch)
        ids = batch["indices"].to(self.device, torch.float64)
        for i, (mask, truth) in enumerate(zip(masks, truth_masks)):
            for counts, runs_state, m in (
                ("det_counts", "det_runs", mask),
                ("truth_counts", "truth_runs", truth),
            ):
                runs = mask_runs(m)
                getattr(self, counts).append(
                    torch.tensor([len(r) for r in runs], dtype=torch.int64, device=self.device)
                )
                flat = np.concatenate(runs) if runs else np.zeros(0, dtype=np.int64)
                getattr(self, runs_state).append(torch.from_numpy(flat.astype(np.int64)).to(self.device))
            h, w = (mask if mask.ndim == 3 else truth).shape[-2:]
            self.mask_sizes.append(
                torch.tensor([[float(ids[i]), h, w]], dtype=torch.float64, device=self.device)
            )

    def _evaluate(self) -> dict[str, Tensor]:
        """``DetectionMAP``'s keys plus ``mask_mAP50-95``, ``mask_mAP50``, ``mask_mAP75``, ``mask_AP/<class>``, and
        ``fitness``: the reference's model-selection score, ``fitness(box) + fitness(mask)`` with
        ``fitness = 0.1 * mAP50 + 0.9 * mAP50-95`` (what ``best.ckpt`` follows for this task)."""
        out = super()._evaluate()
        cat = self._host_states()
        sizes = {int(r[0]): (int(r[1]), int(r[2])) for r in cat["mask_sizes"].tolist()}
        image_ids = torch.unique(cat["images"].reshape(-1))  # sorted: the same order on any world size
        # Rows and run states were gathered in the same (rank, then update) order: offsets line up.
        rows = []
        for name, counts in (("detections", "det_counts"), ("truths", "truth_counts")):
            count = cat[counts].to(torch.float64)
            rows.append(torch.cat((cat[name], count[:, None], (torch.cumsum(count, 0) - count)[:, None]), 1))
        dets, truths = self._per_image(rows[0], rows[1], image_ids)
        preds, targets, matched = [], [], []
        for image, d, t in zip(image_ids.tolist(), dets, truths):
            h, w = sizes[int(image)]
            preds.append({"masks": self._decode(d, cat["det_runs"].cpu(), h, w), "scores": d[:, 4].float(),
                          "labels": d[:, 5].long()})  # fmt: skip
            targets.append(
                {"masks": self._decode(t, cat["truth_runs"].cpu(), h, w), "labels": t[:, 4].long()}
            )
            if self.keep_evaluation and len(d):
                iou = mask_iou(targets[-1]["masks"], preds[-1]["masks"]).numpy()
                matched.append(match_at_half(iou, t[:, 4].numpy(), d[:, 5].numpy()))
        evaluator = MeanAveragePrecision(
            iou_type="segm",
            class_metrics=True,
            backend="faster_coco_eval",
            max_detection_thresholds=[1, 10, self.max_detections],
            extended_summary=self.keep_evaluation,
            sync_on_compute=False,
        )
        evaluator.update(preds, targets)
        result = evaluator.compute()
        if self.evaluation is not None and self.keep_evaluation:
            self.evaluation.coco["mask"] = self._kept(result)
            self.evaluation.matched["mask"] = np.concatenate(matched) if matched else np.zeros(0, bool)
        out.update(
            {"mask_mAP50-95": result["map"], "mask_mAP50": result["map_50"], "mask_mAP75": result["map_75"]}
        )
        classes, per_class = result.get("classes"), result.get("map_per_class")
        if classes is not None and per_class is not None and per_class.numel() == classes.numel():
            for cls, ap in zip(classes.reshape(-1).tolist(), per_class.reshape(-1)):
                name = self.class_names[cls] if self.class_names and cls < len(self.class_names) else str(cls)
                out[f"mask_AP/{name}"] = ap
        out["fitness"] = sum(0.1 * out[f"{p}mAP50"] + 0.9 * out[f"{p}mAP50-95"] for p in ("", "mask_"))
        return out

    @staticmethod
    def _decode(rows: Tensor, runs: Tensor, height: int, width: int) -> Tensor:
        """The (n, h, w) bool masks of ``rows`` (last two columns: run count, start in ``runs``)."""
        if not len(rows):
            return torch.zeros((0, height, width), dtype=torch.bool)
        counts, starts = rows[:, -2].long().cpu(), rows[:, -1].long().cpu()
        first = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
        index = torch.repeat_interleave(starts, counts) + torch.arange(int(counts.sum())) - first
        return decode_runs(runs[index], counts, height, width)
