"""Throughput and data wait of every training step, without a host sync.

``Throughput`` logs, at the steps the loggers write (every ``trainer.log_every_n_steps``; means over the last
``window`` steps):

- ``perf/images_per_second``: images of the global batch per second (the per-device figure x world size:
  every rank steps together under DDP), and ``perf/images_per_second_per_device``;
- ``perf/data_wait_fraction``: the share of the step spent waiting for the next batch;
- ``perf/peak_memory_gib`` on CUDA: the largest allocation of this device so far (allocator statistics).

The progress bar shows ``img/s``. When more than ``warn_fraction`` of the step goes to waiting for data for
``warn_steps`` steps in a row, one warning names the usual fixes.

How it is measured. A step is the wall time from one ``on_train_batch_start`` to the next; the wait is the
part of it from this callback's ``on_train_batch_end`` to the next ``on_train_batch_start`` (fetching the
next batch, moving it to the device, and the loop's bookkeeping between steps, which is small). Steps
that contain validation or a checkpoint save, and the first step of each epoch (workers starting), are left
out. On CUDA the host clocks see the host, which may wait for the GPU anywhere (a ``.item()`` in a progress
bar): there the wait is also measured on the GPU, as the time it sat idle between the end of one step's
work and the start of the next (CUDA events, read once completed: no sync), and the smaller of the two
shares is reported. Nothing here reads a device tensor; the logged values are CPU tensors.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

log = logging.getLogger(__name__)

GIB = 1 << 30
FIXES = (
    "likely fixes: more DataLoader workers (--data.num_workers), decoded images kept in RAM "
    "(--data.cache_images true), or fewer CPU-heavy augmentations (mosaic, mixup, perspective)"
)


def batch_images(batch: Any) -> int:
    """Counts the images in a batch: the leading size of batch["images"], a host-side attribute."""
    images = (
        batch.get("images")
        if isinstance(batch, dict)
        else batch[0]
        if isinstance(batch, list | tuple)
        else batch
    )
    return int(images.shape[0]) if hasattr(images, "shape") and len(images.shape) else 0


class _GpuIdle:
    """Idle gaps of the GPU between steps from CUDA events, read only once they have completed."""

    def __init__(self, window: int, make_event: Callable[[], Any]) -> None:
        self.make_event = make_event
        self.pending: deque[list[Any]] = deque()  # [start event, end event or None, measured]
        self.done: deque[tuple[float, float]] = deque(maxlen=window)  # (idle ms, step ms)

    def start(self, counted: bool) -> None:
        event = self.make_event()
        event.record()
        if self.pending:  # ``counted``: whether the step that ends here is measured
            self.pending[-1][2] = counted
        self.pending.append([event, None, False])
        while len(self.pending) >= 2 and self.pending[1][0].query():
            (start, end, ok), nxt = self.pending.popleft(), self.pending[0]
            if ok and end is not None:
                self.done.append((end.elapsed_time(nxt[0]), start.elapsed_time(nxt[0])))
        while len(self.pending) > 256:  # a stream that never completes: keep the memory bounded
            self.pending.popleft()

    def end(self) -> None:
        if self.pending:
            event = self.make_event()
            event.record()
            self.pending[-1][1] = event

    def fraction(self) -> float | None:
        if not self.done:
            return None
        return sum(idle for idle, _ in self.done) / max(sum(step for _, step in self.done), 1e-9)


class Throughput(Callback):
    """Logs images/s (global and per device), the data-wait share of the step and, on CUDA, peak memory.

    Args:
        window: steps the logged means are taken over.
        warn_fraction: data-wait share above which a step counts as starved.
        warn_steps: starved steps in a row before the (one) warning.
    """

    def __init__(self, window: int = 20, warn_fraction: float = 0.2, warn_steps: int = 50) -> None:
        if window < 1 or warn_steps < 1 or not 0 < warn_fraction < 1:
            raise ValueError(
                f"Throughput: window and warn_steps must be >= 1 and warn_fraction in (0, 1), got {window}, "
                f"{warn_steps}, {warn_fraction}"
            )
        self.window = window
        self.warn_fraction = warn_fraction
        self.warn_steps = warn_steps
        self.steps: deque[tuple[int, float, float]] = deque(maxlen=window)  # (images, step s, wait s)
        self.starved = 0
        self.warned = False
        self._start: float | None = None
        self._end: float | None = None
        self._images = 0
        self._skip = True
        self._gpu: _GpuIdle | None = None

    # ------------------------------------------------------------------------------------ hooks
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            self._gpu = _GpuIdle(self.window, lambda: torch.cuda.Event(enable_timing=True))

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._skip = True  # the first fetch of an epoch starts the workers

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._skip = True

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._skip = True

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        counted = not self._skip and self._start is not None and self._end is not None
        if self._gpu is not None:
            self._gpu.start(counted)
        if counted:
            step, wait = now - self._start, now - self._end
            self.steps.append((self._images, step, wait))
            self._check_starved(wait / step if step > 0 else 0.0, trainer)
            every = max(int(trainer.log_every_n_steps or 1), 1)
            if (trainer.global_step + 1) % every == 0:  # the steps the loggers write (self.log costs ~0.1 ms)
                self._log(trainer, pl_module)
        self._start, self._end, self._skip = now, None, False
        self._images = batch_images(batch)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._gpu is not None:
            self._gpu.end()
        self._end = time.perf_counter()

    # ------------------------------------------------------------------------------------ figures
    def images_per_second(self) -> float:
        """Returns the per-device images/s over the window, nan before the first measured step."""
        seconds = sum(s for _, s, _ in self.steps)
        return sum(n for n, _, _ in self.steps) / seconds if seconds > 0 else math.nan

    def data_wait_fraction(self) -> float:
        """Returns data wait over step time in the window; on CUDA the smaller of host and GPU-idle shares."""
        seconds = sum(s for _, s, _ in self.steps)
        host = sum(w for _, _, w in self.steps) / seconds if seconds > 0 else math.nan
        gpu = self._gpu.fraction() if self._gpu is not None else None
        return min(host, gpu) if gpu is not None and not math.isnan(host) else host

    def _check_starved(self, fraction: float, trainer: L.Trainer) -> None:
        if self._gpu is not None:  # the host share alone overstates on CUDA: take the GPU's when known
            gpu = self._gpu.fraction()
            fraction = min(fraction, gpu) if gpu is not None else fraction
        self.starved = self.starved + 1 if fraction > self.warn_fraction else 0
        if self.starved >= self.warn_steps and not self.warned:
            self.warned = True
            log.warning(
                "rank %d: the training step waited for data %.0f%% of its time for %d steps in a row; the "
                "DataLoader does not keep up (%s)", trainer.global_rank, 100 * self.data_wait_fraction(),
                self.warn_steps, FIXES,
            )  # fmt: skip

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        per_device = self.images_per_second()
        values = {
            "perf/images_per_second": per_device * trainer.world_size,
            "perf/images_per_second_per_device": per_device,
            "perf/data_wait_fraction": self.data_wait_fraction(),
        }
        if pl_module.device.type == "cuda":
            values["perf/peak_memory_gib"] = torch.cuda.max_memory_allocated(pl_module.device) / GIB
        options = {"on_step": True, "on_epoch": False, "batch_size": 1, "rank_zero_only": True}
        for name, value in values.items():  # CPU tensors: logging them moves nothing to the device
            pl_module.log(name, torch.tensor(value), **options)
        pl_module.log("img/s", torch.tensor(round(values["perf/images_per_second"], 1)), prog_bar=True,
                      logger=False, **options)  # fmt: skip
