"""Detection mAP on torchmetrics, fed with the DataModule's batches and the post-processed detections."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.detection import MeanAveragePrecision
from torchvision.ops import box_convert

from yolo11_lightning.ops.letterbox import detections_to_original, letterbox_to_original
from yolo11_lightning.training.metrics.class_results import Evaluation
from yolo11_lightning.training.metrics.reference_ap import as_tensor, reference_style_map

# Row layouts of the flat states: detections [image, x1, y1, x2, y2, score, class], truths [image, x1, y1, x2, y2, class].
_STATE_WIDTHS = {"detections": 7, "truths": 6, "images": 1}


class DetectionMAP(Metric):
    """COCO-style mAP (IoU 0.50:0.05:0.95, 101-point) in original image pixels.

    The COCO evaluation is ``torchmetrics.detection.MeanAveragePrecision`` (faster-coco-eval backend).
    Its own distributed sync gathers one tensor per image and so needs the same image count on every
    rank; evaluation sharding here is unpadded (ranks may differ by one image), so this metric keeps flat
    ``cat`` states keyed by dataset index instead, gathers those, and evaluates them in index order on
    each rank: the distributed value equals the single-process value exactly.

    ``reference_style=True`` adds ``mAP50-95_reference_style``: the same detections scored by the
    reference validator's rules (``training.metrics.reference_ap``), for comparison with Ultralytics logs. Like
    the reference, it matches in letterboxed-input pixels and does not clip the detections to the image
    (COCO scores them clipped, in original pixels), so two more states keep them as they come out of NMS.

    With ``keep_evaluation`` set (the result pictures and the closing summary set it on rank 0), each compute
    also keeps what it scored as ``evaluation`` (``class_results.Evaluation``), for the per-class results.
    """

    full_state_update = False

    def __init__(
        self,
        class_names: list[str] | None = None,
        max_detections: int = 300,
        reference_style: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.class_names = class_names
        self.reference_style = reference_style
        self.max_detections = max_detections
        self.keep_evaluation = False
        self.evaluation: Evaluation | None = None
        self._widths = dict(_STATE_WIDTHS)
        if reference_style:  # detections and truths in letterboxed pixels, unclipped
            self._widths.update({"input_detections": 7, "input_truths": 6})
        for name in self._widths:
            self.add_state(name, default=[], dist_reduce_fx="cat")

    @staticmethod
    def to_original(detections: list[Tensor], batch: dict[str, Any]) -> list[Tensor]:
        """Map (n, 6) detections from letterboxed-input pixels to original image pixels (``ops.letterbox``)."""
        return detections_to_original(detections, batch["scales"], batch["pads"], batch["orig_sizes"])

    @staticmethod
    def targets_in_input(batch: dict[str, Any]) -> list[Tensor]:
        """Ground truth of each image as (m, 5) ``[x1, y1, x2, y2, class]`` in letterboxed-input pixels."""
        targets, images = batch["targets"], batch["images"]
        height, width = images.shape[-2:]
        size = torch.tensor([width, height, width, height], device=targets.device, dtype=targets.dtype)
        boxes = box_convert(targets[:, 2:6] * size, "cxcywh", "xyxy")
        return [
            torch.cat((boxes[targets[:, 0] == i], targets[targets[:, 0] == i, 1:2]), 1)
            for i in range(images.shape[0])
        ]

    @classmethod
    def targets_to_original(cls, batch: dict[str, Any]) -> list[Tensor]:
        """Ground truth of each image as (m, 5) ``[x1, y1, x2, y2, class]`` in original pixels."""
        out = []
        for i, truth in enumerate(cls.targets_in_input(batch)):
            original = letterbox_to_original(
                truth[:, :4], batch["scales"][i], batch["pads"][i], batch["orig_sizes"][i]
            )
            out.append(torch.cat((original, truth[:, 4:5]), 1))
        return out

    def update(self, detections: list[Tensor], batch: dict[str, Any]) -> None:
        """Add one batch: ``detections`` per image (n, 6) in letterboxed-input pixels."""
        ids = batch["indices"].to(self.device, torch.float64)
        for i, (det, truth) in enumerate(
            zip(self.to_original(detections, batch), self.targets_to_original(batch))
        ):
            self.detections.append(torch.cat((ids[i].expand(len(det), 1), det.double()), 1))
            self.truths.append(torch.cat((ids[i].expand(len(truth), 1), truth.double()), 1))
        self.images.append(ids[:, None])
        if self.reference_style:
            for i, (det, truth) in enumerate(zip(detections, self.targets_in_input(batch))):
                self.input_detections.append(torch.cat((ids[i].expand(len(det), 1), det.double()), 1))
                self.input_truths.append(torch.cat((ids[i].expand(len(truth), 1), truth.double()), 1))

    def _sync_dist(self, dist_sync_fn: Any = None, process_group: Any = None) -> None:
        # A rank that saw no batch must still send a correctly shaped (0, width) tensor to the gather.
        for name, width in self._widths.items():
            if not getattr(self, name):  # width 0: a 1-D int64 state (segmentation's mask runs)
                shape, dtype = ((0, width), torch.float64) if width else ((0,), torch.int64)
                setattr(self, name, [torch.zeros(shape, dtype=dtype, device=self.device)])
        super()._sync_dist(dist_sync_fn, process_group)

    def _host_states(self) -> dict[str, Tensor]:
        """Every flat state, concatenated and copied to the host once (the evaluation reads them there)."""
        return {
            name: (torch.cat(value) if isinstance(value, list) else value).cpu()
            for name in self._widths
            for value in (getattr(self, name),)
        }

    @staticmethod
    def _per_image(
        detections: Tensor, truths: Tensor, image_ids: Tensor
    ) -> tuple[list[Tensor], list[Tensor]]:
        """Rows ``[image, ...]`` split by image in ``image_ids`` order (within an image: as added)."""
        out: tuple[list[Tensor], list[Tensor]] = ([], [])
        for rows, into in ((detections, out[0]), (truths, out[1])):
            rows = rows[rows[:, 0].argsort(stable=True)]
            key = rows[:, 0].contiguous()
            starts = torch.searchsorted(key, image_ids).tolist()
            ends = torch.searchsorted(key, image_ids, right=True).tolist()
            into.extend(rows[a:b, 1:] for a, b in zip(starts, ends))
        return out

    def compute(self) -> dict[str, Tensor]:
        """{"mAP50-95", "mAP50", "mAP75", "AP/<class name>", ...}; classes absent from the data are left out.

        Evaluated on the host (COCO's evaluation is CPU code); the values are returned on the metric's device,
        where every other metric of the module lives, so that any consumer (a logger's sync, a collective)
        finds them on the process group's device."""
        return {name: value.to(self.device) for name, value in self._evaluate().items()}

    @staticmethod
    def _kept(result: dict[str, Any]) -> dict[str, Tensor]:
        """What ``Evaluation.coco`` keeps of an extended COCO result (not its per-image IoUs)."""
        return {key: result[key] for key in Evaluation.KEPT}

    def _evaluate(self) -> dict[str, Tensor]:
        """``compute``'s values, on the host."""
        cat = self._host_states()
        evaluator = MeanAveragePrecision(
            box_format="xyxy",
            iou_type="bbox",
            class_metrics=True,
            backend="faster_coco_eval",
            max_detection_thresholds=[1, 10, self.max_detections],
            extended_summary=self.keep_evaluation,
            sync_on_compute=False,
        )
        image_ids = torch.unique(cat["images"].reshape(-1))  # sorted: the same order on any world size
        det, truth = (rows[rows[:, 0].argsort(stable=True)] for rows in (cat["detections"], cat["truths"]))
        det_start = torch.searchsorted(det[:, 0].contiguous(), image_ids).tolist()
        det_end = torch.searchsorted(det[:, 0].contiguous(), image_ids, right=True).tolist()
        truth_start = torch.searchsorted(truth[:, 0].contiguous(), image_ids).tolist()
        truth_end = torch.searchsorted(truth[:, 0].contiguous(), image_ids, right=True).tolist()
        preds, targets = [], []
        for i in range(len(image_ids)):
            d, t = det[det_start[i] : det_end[i]], truth[truth_start[i] : truth_end[i]]
            preds.append({"boxes": d[:, 1:5].float(), "scores": d[:, 5].float(), "labels": d[:, 6].long()})
            targets.append({"boxes": t[:, 1:5].float(), "labels": t[:, 5].long()})
        evaluator.update(preds, targets)
        result = evaluator.compute()
        out = {"mAP50-95": result["map"], "mAP50": result["map_50"], "mAP75": result["map_75"]}
        if self.keep_evaluation:
            self.evaluation = Evaluation(det, truth, len(image_ids), {"box": self._kept(result)})
        if self.reference_style:
            out["mAP50-95_reference_style"] = as_tensor(
                reference_style_map(*self._per_image(cat["input_detections"], cat["input_truths"], image_ids))
            )
        classes, per_class = result.get("classes"), result.get("map_per_class")
        if classes is not None and per_class is not None and per_class.numel() == classes.numel():
            for cls, ap in zip(classes.reshape(-1).tolist(), per_class.reshape(-1)):
                name = self.class_names[cls] if self.class_names and cls < len(self.class_names) else str(cls)
                out[f"AP/{name}"] = ap
        return out
