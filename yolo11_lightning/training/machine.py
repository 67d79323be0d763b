"""Settings of the machine a run is on, not of the model: ``torch.compile`` and host-memory reuse.

They belong to the Trainer side (``--machine.compile``, ``--machine.keep_host_memory`` on the CLI,
``MachineSettings(...)`` in Python), so they are not model hyper-parameters: a checkpoint trained with
``compile`` on a GPU node does not carry it to the laptop that validates it.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from yolo11_lightning.training.host_memory import keep_freed_host_memory

# Defaults of the settings; YOLO11Module's deprecated arguments of the same names override them.
MACHINE_DEFAULTS = {"compile": False, "keep_host_memory": True}


def compile_in_place(model: Any) -> None:
    """``nn.Module.compile`` (state-dict keys unchanged), once: a second call does nothing."""
    if not getattr(model, "_compiled_call_impl", None):
        model.compile()


class MachineSettings(Callback):
    """Apply the machine settings of this run to the module's detector and to the process.

    Args:
        compile: ``torch.compile`` the detector (``nn.Module.compile``: state-dict keys unchanged). Costs a
            compile at the first step of each mode (train, eval); pays off on long GPU runs. Done after the
            EMA callback copied the plain module (at fit start), so the copy is not a compiled wrapper.
        keep_host_memory: when running on a CPU (Linux, glibc), keep freed memory in the process instead of
            returning it to the OS after every step (``training.host_memory``): up to 1.5x faster CPU steps
            at 640 px. Process-wide; the process keeps its peak memory.
    """

    def __init__(self, compile: bool = False, keep_host_memory: bool = True) -> None:
        self.compile = compile
        self.keep_host_memory = keep_host_memory

    def _setting(self, pl_module: L.LightningModule, name: str) -> bool:
        """This callback's value, unless the module was given the deprecated argument of the same name."""
        overrides = getattr(pl_module, "machine_overrides", {})
        return bool(overrides.get(name, getattr(self, name)))

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._setting(pl_module, "keep_host_memory") and trainer.strategy.root_device.type == "cpu":
            keep_freed_host_memory()
        if stage != "fit" and self._setting(pl_module, "compile"):  # no EMA copy outside fit
            compile_in_place(pl_module.model)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After every callback's setup, where Lightning's weight averaging deep-copies the module.
        if self._setting(pl_module, "compile"):
            compile_in_place(pl_module.model)
