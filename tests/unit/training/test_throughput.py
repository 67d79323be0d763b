"""The throughput callback: finite images/s and data-wait figures, a slowed loader waits more than a fast one,
one warning when data keeps the step waiting."""

from __future__ import annotations

import logging
import math
import time

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch import nn
from torch.utils.data import DataLoader, Dataset

from yolo11_lightning.cli.lightning_cli import default_callbacks
from yolo11_lightning.training.callbacks.throughput import Throughput, _GpuIdle

KEYS = ("perf/images_per_second", "perf/images_per_second_per_device", "perf/data_wait_fraction")


class Images(Dataset):
    """16 images of 32 px; ``sleep`` seconds per item stands for a slow pipeline."""

    def __init__(self, sleep: float) -> None:
        self.sleep = sleep

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        time.sleep(self.sleep)
        return {"images": torch.full((3, 32, 32), index, dtype=torch.uint8)}


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 16, 3))

    def training_step(self, batch, batch_idx):
        return self.net(batch["images"].float()).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Memory(Logger):
    """Keeps every logged row."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, float]] = []

    name, version = "memory", 0

    def log_metrics(self, metrics, step=None) -> None:
        self.rows.append(dict(metrics))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


def fit(sleep: float, callback: Throughput) -> tuple[list[dict[str, float]], dict]:
    logger = Memory()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=12, logger=logger, log_every_n_steps=1, callbacks=[callback],
        enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
    )  # fmt: skip
    trainer.fit(Tiny(), DataLoader(Images(sleep), batch_size=2))
    return [r for r in logger.rows if KEYS[0] in r], dict(trainer.progress_bar_metrics)


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[list[dict[str, float]], dict]]:
    return {"fast": fit(0.0, Throughput(window=4)), "slow": fit(0.01, Throughput(window=4))}


def test_logged_figures_exist_are_finite_and_shown_in_the_progress_bar(runs) -> None:
    for rows, bar in runs.values():
        assert len(rows) >= 8  # every step after the first of the epoch
        for row in rows:
            assert all(math.isfinite(row[k]) for k in KEYS), row
            assert row[KEYS[0]] > 0 and row[KEYS[0]] == pytest.approx(row[KEYS[1]])  # one device
            assert 0 <= row["perf/data_wait_fraction"] <= 1
        assert "img/s" in bar and bar["img/s"] > 0


def test_a_slow_loader_waits_a_larger_share_of_the_step_than_a_fast_one(runs) -> None:
    def wait(rows: list[dict[str, float]]) -> float:
        return sum(r["perf/data_wait_fraction"] for r in rows) / len(rows)

    assert wait(runs["slow"][0]) > wait(runs["fast"][0])


def test_one_warning_names_the_fixes_when_data_keeps_the_step_waiting(caplog) -> None:
    callback = Throughput(
        window=4, warn_fraction=0.01, warn_steps=3
    )  # 10 starved steps: 3 in a row, and more
    with caplog.at_level(logging.WARNING, logger="yolo11_lightning.training.callbacks.throughput"):
        fit(0.01, callback)
    warnings = [r.getMessage() for r in caplog.records if "waited for data" in r.getMessage()]
    assert len(warnings) == 1 and callback.warned
    for fix in ("--data.num_workers", "--data.cache_images", "augmentations"):
        assert fix in warnings[0]


def test_gpu_idle_gaps_are_read_only_from_completed_events() -> None:
    clock = iter(range(100))

    class Event:
        """A CUDA event stand-in: a timestamp (ms) that completes only when ``done`` says so."""

        def __init__(self) -> None:
            self.t, self.complete = 0.0, False

        def record(self) -> None:
            self.t = float(next(clock))

        def query(self) -> bool:
            return self.complete

        def elapsed_time(self, other: Event) -> float:
            assert self.complete and other.complete, "read before completion: that would sync"
            return other.t - self.t

    made: list[Event] = []
    gaps = _GpuIdle(4, lambda: made.append(Event()) or made[-1])
    gaps.start(True), gaps.end()  # t 0 .. 1
    gaps.start(True), gaps.end()  # t 2 .. 3: the GPU has not got there yet
    assert gaps.fraction() is None
    for event in made:
        event.complete = True
    gaps.start(True)  # t 4: steps 1 and 2 have completed, this start has not
    assert list(gaps.done) == [(1.0, 2.0)] and gaps.fraction() == 0.5  # idle 1 ms of a 2 ms step
    gaps.end()  # t 5
    for event in made:
        event.complete = True
    gaps.start(False)  # t 6: the step t 4 .. 6 is left out (say validation ran in it)
    gaps.end()  # t 7
    gaps.start(True)  # t 8
    for event in made:
        event.complete = True
    gaps.start(True)  # t 9
    assert list(gaps.done) == [(1.0, 2.0)] * 3  # t 0-2, 2-4, 6-8; 8-9 has not completed


def test_it_is_a_default_callback() -> None:
    assert sum(isinstance(c, Throughput) for c in default_callbacks()) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs only show on an accelerator")
def test_the_hooks_do_not_sync_with_the_host_on_cuda() -> None:
    from types import SimpleNamespace

    x = torch.randn(2048, 2048, device="cuda")
    logged: dict[str, torch.Tensor] = {}
    module = SimpleNamespace(
        device=x.device, log=lambda name, value, **kwargs: logged.__setitem__(name, value)
    )
    trainer = SimpleNamespace(world_size=2, global_step=0, log_every_n_steps=1, global_rank=0)
    callback = Throughput(window=4)
    callback.on_train_start(trainer, module)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(8):
            callback.on_train_batch_start(trainer, module, {"images": x[:4]}, step)
            x = (x @ x).tanh()  # queued work the host does not wait for
            callback.on_train_batch_end(trainer, module, None, {"images": x[:4]}, step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert {*KEYS, "perf/peak_memory_gib"} <= set(logged)
    assert all(v.device.type == "cpu" and math.isfinite(float(v)) for v in logged.values())
    assert logged["perf/images_per_second"] == pytest.approx(2 * logged["perf/images_per_second_per_device"])
