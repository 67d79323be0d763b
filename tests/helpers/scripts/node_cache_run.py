"""Two CPU ranks (gloo) train a tiny model on ``YOLODataModule(cache_images=True)``; each rank writes what
``tests/unit/data/test_node_cache.py`` checks into ``OUT_DIR/rank<R>.json``.

    YOLO11_SHM_DIR=... python tests/helpers/scripts/node_cache_run.py DATASET_YAML OUT_DIR

After the second training batch each rank records the cache mappings of itself and its DataLoader workers
(device, inode and PSS from ``/proc/<pid>/smaps``) and the segments still named; after every batch, whether
it equals the batch of the same samples read without a cache.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from torch import nn

from yolo11_lightning.data.dataset import BoxDataset
from yolo11_lightning.data.images.node_cache import PREFIX
from yolo11_lightning.structures.batch import collate_detection
from yolo11_lightning.training.datamodule import YOLODataModule


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def training_step(self, batch, batch_idx):
        return self.conv(batch["images"].float() / 255).mean()

    def validation_step(self, batch, batch_idx):
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2 :].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def cache_mappings(pid: int) -> list[dict]:
    """Every mapping of a cache segment in process ``pid``: device:inode, size and PSS in kB."""
    out, current = [], None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        parts = line.split()
        if "-" in parts[0] and len(parts) >= 5 and ":" not in parts[0]:  # a mapping's header line
            current = None
            if len(parts) >= 6 and PREFIX in parts[5]:
                current = {"inode": f"{parts[3]}:{parts[4]}", "path": " ".join(parts[5:])}
                out.append(current)
        elif current is not None and parts[0] in ("Size:", "Pss:", "Rss:"):
            current[parts[0][:-1].lower()] = int(parts[1])
    return out


class Inspect(Callback):
    def __init__(self, out: Path) -> None:
        self.out = out
        self.same: list[bool] = []
        self.record: dict = {}

    def _same_as_uncached(self, trainer, batch, split: str, epoch: int) -> bool:
        cached = trainer.datamodule.datasets[split]
        plain = BoxDataset(
            [cached.records[i] for i in range(len(cached))], cached.image_size, augment=cached.augment,
            aug=cached.aug, seed=cached.seed, mosaic_until_epoch=cached.mosaic_until_epoch,
            global_batch_size=cached.global_batch_size, partner_batches=cached.partner_batches,
        )  # fmt: skip
        plain.batch_shapes = cached.batch_shapes  # rectangular validation: the same letterbox shapes
        items = [(epoch, i) if cached.augment else i for i in batch["indices"].tolist()]
        expected = collate_detection([plain[item] for item in items])
        return torch.equal(expected["images"], batch["images"]) and torch.equal(
            expected["targets"], batch["targets"]
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.same.append(self._same_as_uncached(trainer, batch, "train", trainer.current_epoch))
        if batch_idx != 1:
            return
        pids = [os.getpid(), *children(os.getpid())]
        maps = {pid: cache_mappings(pid) for pid in pids}
        shm = Path(os.environ["YOLO11_SHM_DIR"])
        self.record = {"maps": maps, "named_segments": sorted(p.name for p in shm.iterdir())}

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.same.append(self._same_as_uncached(trainer, batch, "val", 0))

    def on_train_end(self, trainer, pl_module):
        record = {"rank": trainer.global_rank, "pid": os.getpid(), "same": self.same, **self.record}
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def main() -> None:
    dataset, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    data = YOLODataModule(
        dataset=dataset, batch_size=4, image_size=64, num_workers=1, pin_memory=False, cache_images=True
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(timeout=timedelta(seconds=20)), max_steps=2,
        limit_val_batches=1, num_sanity_val_steps=0, val_check_interval=2, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Inspect(out)],
    )  # fmt: skip
    trainer.fit(Tiny(), data)


if __name__ == "__main__":
    main()
