"""One of 2 gloo ranks whose process group times out after ``TIMEOUT_S``; rank 0's loading of the train labels
is delayed ``DELAY_S`` (longer). Each rank calls ``YOLODataModule.setup`` twice and writes what happened to
``OUT_DIR/rank<R>.json``; ``tests/unit/data/test_cache_scale.py`` checks it.

    python tests/helpers/scripts/cache_wait_run.py RANK PORT DATASET_YAML OUT_DIR

1. rank 0's loading fails (a ``DatasetError``): rank 1 must raise the same one-line error, not hang;
2. rank 0's delayed loading succeeds: rank 1 must wait past the timeout without failing, then read rank 0's
   cache (no check of its own), and both ranks must pass the data agreement (a collective) afterwards.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

import yolo11_lightning.training.datamodule as datamodule_module
from yolo11_lightning.data.sources import yolo as yolo_source
from yolo11_lightning.data.sources.config import DatasetError
from yolo11_lightning.training.datamodule import YOLODataModule

TIMEOUT_S, DELAY_S = 1.0, 2.5


class Strategy:
    root_device = torch.device("cpu")

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        out = [torch.zeros_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(out, tensor)
        return torch.stack(out)


def main() -> None:
    rank, port, yaml, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
    # The store meets the ranks however far apart they start; the group's collectives time out after TIMEOUT_S.
    store = dist.TCPStore("127.0.0.1", int(port), 2, is_master=rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=TIMEOUT_S)
    )
    trainer = SimpleNamespace(
        world_size=2, global_rank=rank, local_rank=rank, node_rank=0, num_devices=2, num_nodes=1,
        strategy=Strategy(), max_epochs=None, lightning_module=None,
    )  # fmt: skip
    real_load, checked = datamodule_module.load_split, []
    real_check = yolo_source.check_images
    yolo_source.check_images = lambda images, *a: checked.extend(images) or real_check(images, *a)
    fail = [True]

    def delayed_load(config, split, **kwargs):
        if rank == 0 and split == "train":
            if fail[0]:
                raise DatasetError("data.yaml:3: a made-up problem on rank 0")
            time.sleep(DELAY_S)
        return real_load(config, split, **kwargs)

    datamodule_module.load_split = delayed_load
    result: dict = {"timeout_s": TIMEOUT_S}
    dm = YOLODataModule(dataset=yaml, batch_size=2, image_size=64, num_workers=0, pin_memory=False)
    dm.trainer = trainer
    start = time.monotonic()
    try:
        dm.setup("fit")
        result["first"] = "no error"
    except Exception as e:
        result["first"] = f"{type(e).__name__}: {e}"
    result["first_s"] = time.monotonic() - start
    fail[0] = False
    start = time.monotonic()
    dm.setup("fit")
    result["second_s"] = time.monotonic() - start
    result["images"] = len(dm.datasets["train"])
    result["checked_images"] = len(checked)
    dist.all_reduce(torch.ones(1))  # the group still works
    dist.destroy_process_group()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
