"""The training step's one collective, and the host values every rank must act on together.

Under DDP a training step needs, beside DDP's own gradient all-reduce:

- the loss normalisers (Σ target scores, foreground count) summed over ranks before the loss divides by them
  (world-size invariance), and the loss terms summed for the logged items and the non-finite guard;
- what one rank saw that all must act on at the same step: a stop signal, a time-based save that is due,
  training images that could not be read (``RANK_FLAGS``).

``StepExchange.sum_over_ranks`` is the loss's ``sum_over_ranks``: it appends the flags to the loss's summary and
sums everything in one ``all_reduce`` of one small tensor per micro-batch. It calls ``torch.distributed`` itself:
Lightning's ``strategy.reduce`` puts a ``barrier()`` before every all-reduce, and on NCCL a barrier makes the
host wait until the GPU has drained its queue.

The flags are host values. They go to the device only when one changes (a signal, a due save: rare), and their
sums come back asynchronously: ``publish`` starts a non-blocking copy at an optimiser-step boundary, ``advance``
at the next boundary makes it the ``agreed`` values. Every rank reads the same sums at the same step, one
optimiser step after they were exchanged, and the host never waits for the device in a steady step.
Elsewhere (end of epoch, validation) ``flush`` reads the newest sums at once.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from yolo11_lightning.training.preemption import STOP_SIGNALS

__all__ = ["RANK_FLAGS", "DeferredHostCopy", "StepExchange", "signal_flag"]


def signal_flag(signum: int) -> str:
    """Returns the flag a stop signal raises, such as "signal_SIGTERM"."""
    return f"signal_{signal.Signals(signum).name}"


# Host values summed over ranks with the loss's summary: counters, so a sum > 0 means "some rank saw it".
RANK_FLAGS: tuple[str, ...] = (*(signal_flag(s) for s in STOP_SIGNALS), "save_due", "substituted")


class DeferredHostCopy:
    """A small device tensor copied to the host without waiting for the device; ``wait`` returns it.

    On CUDA the copy goes to pinned memory behind an event recorded on the current stream; ``wait`` waits for that
    event only, which has long completed when it is read one step later. Another accelerator with an ``Event``
    in its device module works alike; on the CPU the copy is the value.
    """

    def __init__(self, tensor: Tensor) -> None:
        tensor = tensor.detach()
        self.event = None
        if tensor.device.type == "cpu":
            self.host = tensor.clone()
            return
        event_class = getattr(torch.get_device_module(tensor.device), "Event", None)
        if event_class is None:  # no way to know when a non-blocking copy has landed: copy and wait now
            self.host = tensor.to("cpu")
            return
        pinned = tensor.device.type == "cuda"
        self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pinned)
        self.host.copy_(tensor, non_blocking=True)
        self.event = event_class()
        self.event.record()

    def wait(self) -> Tensor:
        if self.event is not None:
            self.event.synchronize()
            self.event = None
        return self.host


class StepExchange:
    """One all-reduce per training micro-batch for the loss's summary and the ranks' flags; see the module.

    Args:
        flags: names of the host values summed over ranks (``RANK_FLAGS``).
    """

    def __init__(self, flags: Sequence[str] = RANK_FLAGS) -> None:
        self.names = tuple(flags)
        self._local = dict.fromkeys(self.names, 0.0)  # this rank's host values
        self._on_device: Tensor | None = None  # the same, on the device (refreshed when one changes)
        self._dirty = True
        self._summed: Tensor | None = None  # the newest sums over ranks (device), from the last exchange
        # Published at the last optimiser-step boundary: (host flags or None, copy of device values or None).
        self._pending: tuple[list[float] | None, DeferredHostCopy | None] | None = None
        self.agreed = dict.fromkeys(self.names, 0.0)  # the sums every rank acts on (one step late)
        self.extra: list[float] = []  # values published beside the flags (``publish(extra=...)``), as read
        self.world_size = 1
        self.all_reduce: Callable[[Tensor], None] | None = None

    # ------------------------------------------------------------------------------------ set-up
    def connect(self) -> None:
        """Uses the default process group when one with more than one rank exists; call it in setup."""
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.world_size = torch.distributed.get_world_size() if distributed else 1
        self.all_reduce = torch.distributed.all_reduce if self.world_size > 1 else None

    # ------------------------------------------------------------------------------------ host values
    def set(self, name: str, value: float) -> None:
        """Sets this rank's value of flag ``name``, kept until changed and sent with the next exchange."""
        value = float(value)
        if self._local[name] != value:
            self._local[name] = value
            self._dirty = True

    def local(self, name: str) -> float:
        return self._local[name]

    # ------------------------------------------------------------------------------------ the exchange
    def sum_over_ranks(self, summary: Tensor) -> Tensor:
        """Sums ``summary`` over ranks for the loss's sum_over_ranks; the flags travel with it."""
        if self.all_reduce is None:
            self._summed = None
            return summary
        if self._dirty or self._on_device is None or self._on_device.device != summary.device:
            # A blocking host-to-device copy, only when a host value changed.
            values = [self._local[n] for n in self.names]
            self._on_device = torch.tensor(values, dtype=summary.dtype, device=summary.device)
            self._dirty = False
        packed = torch.cat((summary, self._on_device.to(summary.dtype)))
        self.all_reduce(packed)
        self._summed = packed[summary.numel() :]
        return packed[: summary.numel()]

    def publish(self, extra: Tensor | None = None) -> None:
        """Starts copying the newest sums to the host after an optimiser step; advance reads them one step on.

        ``extra`` travels with them: device values such as the non-finite guard's counters.

        In one process the flags are this rank's host values, read as they are now: no device copy at all.
        """
        if self.all_reduce is None or self._summed is None:
            # One process, or no exchange since the last boundary (no training step ran): host values.
            flags = (
                [self._local[n] for n in self.names] if self.all_reduce is None else list(self._agreed_list())
            )
            copy = DeferredHostCopy(extra) if extra is not None else None
            self._pending = (flags, copy)
            return
        vector = self._summed.detach().float()
        if extra is not None:
            vector = torch.cat((vector, extra.detach().float().to(vector.device)))
        self._pending = (None, DeferredHostCopy(vector))
        self._summed = None

    def _agreed_list(self) -> list[float]:
        return [self.agreed[n] for n in self.names]

    def advance(self) -> bool:
        """Makes the values published at the previous boundary the agreed ones; False if none was."""
        if self._pending is None:
            return False
        flags, copy = self._pending
        self._pending = None
        values = copy.wait().tolist() if copy is not None else []
        if flags is None:
            flags, values = values[: len(self.names)], values[len(self.names) :]
        self.agreed = dict(zip(self.names, flags))
        self.extra = values
        return True

    def flush(self, extra: Tensor | None = None) -> None:
        """Publishes and reads at once, a host read for epoch ends, not the steady step."""
        self.publish(extra)
        self.advance()

    def reset(self) -> None:
        """Forgets what was exchanged, for a new fit; this rank's host values are kept."""
        self._summed = None
        self._pending = None
        self._on_device = None
        self._dirty = True
        self.agreed = dict.fromkeys(self.names, 0.0)
        self.extra = []
