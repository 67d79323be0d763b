"""One optimiser step and one validation on R CPU ranks; rank 0 writes what the test compares.

    python tests/helpers/scripts/equivalence_run.py DATASET_YAML DEVICES OUT.pt [NON_SQUARE_YAML]

With NON_SQUARE_YAML, a second validation runs on it in rectangular batches (global batch 4), whose
metrics are saved as ``rect_metrics`` with the letterbox shape each image was given (``rect_shapes``).

Run with 1 and with 2 devices by tests/e2e/test_training_ddp.py. BatchNorm is kept in eval mode so that
per-rank batch statistics do not enter the comparison (ARCHITECTURE.md, world-size invariance: BN aside, or SyncBN).
"""

from __future__ import annotations

import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from yolo11_lightning import YOLO11Module, YOLODataModule


class FreezeBatchNorm(Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        for module in pl_module.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.eval()


class RecordGradients(Callback):
    """Keep the gradients the optimiser is about to apply (after DDP's all-reduce)."""

    def __init__(self) -> None:
        self.gradients: dict[str, torch.Tensor] = {}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.epoch = trainer.current_epoch
        for name, param in pl_module.model.named_parameters():
            if param.grad is not None:
                self.gradients[name] = param.grad.detach().clone()


class RecordCarried(Callback):
    """Keep the gradient a window carries from epoch 0 into epoch 1 (after the recipe's epoch-end average)."""

    def __init__(self) -> None:
        self.gradients: dict[str, torch.Tensor] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.current_epoch == 1 and batch_idx == 0:
            for name, param in pl_module.model.named_parameters():
                if param.grad is not None:
                    self.gradients[name] = param.grad.detach().clone()


class NoisyOracle(YOLO11Module):
    """Validation 'detections' = jittered ground truth + false positives, seeded by dataset index.

    Gives a non-trivial mAP that depends on every image, so a rank dropping or duplicating images
    would change it. The noise also depends on the batch's image shape, so an image letterboxed to
    another rectangle than in one process would change it too; ``shapes`` records each index's shape.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.shapes: dict[int, tuple[int, int]] = {}

    def validation_step(self, batch, batch_idx):
        h, w = batch["images"].shape[-2:]
        detections = []
        for i, index in enumerate(batch["indices"].tolist()):
            self.shapes[index] = (h, w)
            g = torch.Generator().manual_seed(1000 + index + 7919 * h + w)
            t = batch["targets"][batch["targets"][:, 0] == i]
            cx, cy, bw, bh = (t[:, 2] * w, t[:, 3] * h, t[:, 4] * w, t[:, 5] * h)
            boxes = torch.stack((cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2), 1)
            boxes = boxes + torch.randn(boxes.shape, generator=g) * 2.0
            fakes = torch.rand(3, 4, generator=g) * w
            fakes[:, 2:] = fakes[:, :2] + 10
            scores = torch.rand(len(boxes) + 3, generator=g)
            classes = torch.cat(
                (t[:, 1], torch.randint(0, self.hparams.num_classes, (3,), generator=g).float())
            )
            detections.append(torch.cat((torch.cat((boxes, fakes)), scores[:, None], classes[:, None]), 1))
        self.val_map.update(detections, batch)


class NoisySegmenter(YOLO11Module):
    """``NoisyOracle`` for the segment task: jittered ground-truth boxes and false positives, each with a
    mask (part of the instance's own mask, or a random blob for a false positive), seeded by
    dataset index, so that the box and the mask mAP both depend on every image."""

    def validation_step(self, batch, batch_idx):
        from yolo11_lightning.tasks.segment.mask_ops import image_target_masks

        h, w = batch["images"].shape[-2:]
        detections, masks, truths = [], [], []
        for i, index in enumerate(batch["indices"].tolist()):
            g = torch.Generator().manual_seed(5000 + index)
            t = batch["targets"][batch["targets"][:, 0] == i]
            truth = image_target_masks(batch["masks"], batch["mask_overlap"], batch["targets"], i)
            cx, cy, bw, bh = (t[:, 2] * w, t[:, 3] * h, t[:, 4] * w, t[:, 5] * h)
            boxes = torch.stack((cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2), 1)
            boxes = boxes + torch.randn(boxes.shape, generator=g) * 2.0
            fakes = torch.rand(2, 4, generator=g) * w
            fakes[:, 2:] = fakes[:, :2] + 10
            # Each instance keeps a random 40-100% of its pixels: mask IoUs spread over the COCO thresholds.
            share = 0.4 + 0.6 * torch.rand(len(truth), 1, 1, generator=g)
            flipped = truth & (torch.rand(truth.shape, generator=g) < share)
            blobs = torch.rand((2, *truth.shape[-2:]), generator=g) < 0.3
            scores = torch.rand(len(boxes) + 2, generator=g)
            classes = torch.cat(
                (t[:, 1], torch.randint(0, self.hparams.num_classes, (2,), generator=g).float())
            )
            detections.append(torch.cat((torch.cat((boxes, fakes)), scores[:, None], classes[:, None]), 1))
            masks.append(torch.cat((flipped, blobs)))
            truths.append(truth)
        self.val_map.update(detections, batch, masks, truths)


class NoisyPoser(YOLO11Module):
    """``NoisyOracle`` for the pose task: jittered ground-truth boxes and keypoints (some pushed far off, so OKS
    spreads over the thresholds) and false positives, seeded by dataset index: box and pose mAP both depend on
    every image."""

    def validation_step(self, batch, batch_idx):
        h, w = batch["images"].shape[-2:]
        detections, keypoints = [], []
        for i, index in enumerate(batch["indices"].tolist()):
            g = torch.Generator().manual_seed(9000 + index)
            own = batch["targets"][:, 0] == i
            t = batch["targets"][own]
            cx, cy, bw, bh = (t[:, 2] * w, t[:, 3] * h, t[:, 4] * w, t[:, 5] * h)
            boxes = torch.stack((cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2), 1)
            boxes = boxes + torch.randn(boxes.shape, generator=g) * 2.0
            fakes = torch.rand(2, 4, generator=g) * w
            fakes[:, 2:] = fakes[:, :2] + 10
            points = batch["keypoints"][own][..., :2] * torch.tensor([w, h])
            spread = torch.rand(len(points), 1, 1, generator=g) * bw.clamp(min=1)[:, None, None] * 0.5
            points = points + torch.randn(points.shape, generator=g) * spread
            points = torch.cat((points, torch.rand(2, points.shape[1], 2, generator=g) * w))
            scores = torch.rand(len(boxes) + 2, generator=g)
            classes = torch.cat(
                (t[:, 1], torch.randint(0, self.hparams.num_classes, (2,), generator=g).float())
            )
            detections.append(torch.cat((torch.cat((boxes, fakes)), scores[:, None], classes[:, None]), 1))
            keypoints.append(
                torch.cat((points, torch.rand(len(points), points.shape[1], 1, generator=g)), -1)
            )
        self.val_map.update(detections, batch, keypoints)


def main() -> None:
    dataset, devices, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    L.seed_everything(0, workers=True)
    data = YOLODataModule(dataset=dataset, batch_size=8, image_size=64, num_workers=0, seed=0, close_mosaic=0)
    # SGD (an update linear in the gradient), no warmup (its first step has LR 0), no accumulation, no EMA,
    # and no clipping: clipping would hide a wrong gradient scale.
    options = dict(scale="n", num_classes=data.num_classes, class_names=data.class_names, optimizer="SGD",
                   warmup_epochs=0.0,
                   nominal_batch=8, ema=False, log_images=0, grad_clip_norm=0.0)  # fmt: skip
    module = YOLO11Module(**options)
    initial = {k: v.clone() for k, v in module.model.state_dict().items()}
    trainer_args = dict(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)  # fmt: skip
    recorder = RecordGradients()
    trainer = L.Trainer(
        max_steps=1, limit_val_batches=0, callbacks=[FreezeBatchNorm(), recorder], **trainer_args
    )
    trainer.fit(module, data)
    trained = {k: v.detach().clone() for k, v in module.model.state_dict().items()}

    # A window of 3 batches over epochs of 2: the reference's first step comes after epoch 1's first batch,
    # with epoch 0's gradient carried over the epoch end (and averaged over ranks there).
    carried, at_step = RecordCarried(), RecordGradients()
    carry_module = YOLO11Module(**{**options, "nominal_batch": 24})
    carry_module.model.load_state_dict(initial)  # the RNG moved on differently with 1 and 2 ranks
    carry_trainer = L.Trainer(max_epochs=2, max_steps=1, limit_val_batches=0,
                              callbacks=[FreezeBatchNorm(), carried, at_step], **trainer_args)  # fmt: skip
    carry_trainer.fit(carry_module, data)

    oracle = NoisyOracle(**options)
    metrics = L.Trainer(**trainer_args).validate(oracle, data, verbose=False)[0]
    result = {"initial": initial, "trained": trained, "gradients": recorder.gradients, "metrics": metrics,
              "carried": carried.gradients, "carried_step": at_step.gradients, "carry_step_epoch": at_step.epoch}  # fmt: skip
    if len(sys.argv) > 4:  # rectangular validation on non-square images, an odd count: unequal shards
        rect_data = YOLODataModule(dataset=sys.argv[4], batch_size=4, image_size=64, num_workers=0)
        oracle = NoisyOracle(
            **{**options, "num_classes": rect_data.num_classes, "class_names": rect_data.class_names}
        )
        rect_trainer = L.Trainer(**trainer_args)
        result["rect_metrics"] = rect_trainer.validate(oracle, rect_data, verbose=False)[0]
        gathered = [None] * rect_trainer.world_size
        if rect_trainer.world_size > 1:
            torch.distributed.all_gather_object(gathered, oracle.shapes)
        else:
            gathered = [oracle.shapes]
        result["rect_shapes"] = {k: v for shard in gathered for k, v in shard.items()}
    if len(sys.argv) > 5:  # the segment task: box and mask mAP over unpadded shards of an odd count
        seg_data = YOLODataModule(
            dataset=sys.argv[5], batch_size=4, image_size=64, num_workers=0, task="segment"
        )
        segmenter = NoisySegmenter(**{**options, "task": "segment", "num_classes": seg_data.num_classes,
                                      "class_names": seg_data.class_names})  # fmt: skip
        result["seg_metrics"] = L.Trainer(**trainer_args).validate(segmenter, seg_data, verbose=False)[0]
    if len(sys.argv) > 6:  # the pose task: box and keypoint mAP over unpadded shards of an odd count
        pose_data = YOLODataModule(
            dataset=sys.argv[6], batch_size=4, image_size=64, num_workers=0, task="pose"
        )
        poser = NoisyPoser(**{**options, "task": "pose", "kpt_shape": [5, 3], "num_classes": pose_data.num_classes,
                              "class_names": pose_data.class_names})  # fmt: skip
        result["pose_metrics"] = L.Trainer(**trainer_args).validate(poser, pose_data, verbose=False)[0]
    if trainer.is_global_zero:
        torch.save(result, out)


if __name__ == "__main__":
    main()
