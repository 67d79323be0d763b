"""Settings of the machine a run is on, not of the model: ``torch.compile``, host-memory reuse, CPU threads.

They belong to the Trainer side (``--machine.compile``, ``--machine.keep_host_memory``,
``--machine.cpu_threads`` on the CLI,
``MachineSettings(...)`` in Python), so they are not model hyper-parameters: a checkpoint trained with
``compile`` on a GPU node does not carry it to the laptop that validates it.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from yolo11_lightning.data.cpu_cores import usable_cpus
from yolo11_lightning.training.cpu_threads import openmp_waits_briefly, training_threads
from yolo11_lightning.training.host_memory import keep_freed_host_memory

# Defaults of the settings, also what a Trainer without this callback gets (``YOLO11Module.setup``).
MACHINE_DEFAULTS = {"compile": False, "keep_host_memory": True}
# Below this many images per GPU a training step leaves the GPU mostly idle (the log says so).
FEW_IMAGES_PER_GPU = 8


def compile_in_place(model: Any) -> None:
    """Compiles the model in place by nn.Module.compile, state-dict keys unchanged; once only."""
    if not getattr(model, "_compiled_call_impl", None):
        model.compile()


def _say_few_images_per_gpu(trainer: L.Trainer) -> None:
    """Logs one line on rank 0 when the global batch gives a GPU fewer than ``FEW_IMAGES_PER_GPU`` images."""
    batch = getattr(trainer.datamodule, "batch_size", None)
    world = trainer.num_nodes * trainer.num_devices
    if not isinstance(batch, int) or batch // world >= FEW_IMAGES_PER_GPU:
        return
    rank_zero_info(
        f"GPU run: {batch // world} image(s) per GPU (data.batch_size={batch} is the GLOBAL batch over {world} "
        f"GPU(s)), too few to keep a GPU busy; --data.batch_size {16 * world} gives 16 per GPU"
    )


class MachineSettings(Callback):
    """Apply the machine settings of this run to the module's detector and to the process.

    Args:
        compile: ``torch.compile`` the detector (``nn.Module.compile``: state-dict keys unchanged). Costs a
            compile at the first step of each mode (train, eval); pays off on long GPU runs. Done after the
            EMA callback copied the plain module (at fit start), so the copy is not a compiled wrapper.
        keep_host_memory: when running on a CPU (Linux, glibc), keep freed memory in the process instead of
            returning it to the OS after every step (``training.host_memory``): up to 1.5x faster CPU steps
            at 640 px. Process-wide; the process keeps its peak memory.
        cpu_threads: torch threads of each process when running on a CPU. ``"auto"``: its share of the usable
            cores (affinity, container quota) among the local ranks; when OpenMP threads spin long while they
            wait (no ``GOMP_SPINCOUNT=1000`` as the ``yolo11-lightning`` command sets, no
            ``OMP_WAIT_POLICY=PASSIVE``), minus the DataModule's loader workers, whose cores spinning threads
            would take (``training.cpu_threads``);
            at least 1, and only ever lower than torch's current count. An int sets it; None leaves torch's
            as it is. Restored when the run ends (notebooks keep their setting).
    """

    def __init__(
        self,
        compile: bool = False,
        keep_host_memory: bool = True,
        cpu_threads: int | Literal["auto"] | None = "auto",
    ) -> None:
        if not (cpu_threads in (None, "auto") or (isinstance(cpu_threads, int) and cpu_threads >= 1)):
            raise ValueError(f"machine.cpu_threads must be 'auto', None or an int >= 1, got {cpu_threads!r}")
        self.compile = compile
        self.keep_host_memory = keep_host_memory
        self.cpu_threads = cpu_threads
        self._threads_before: int | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        on_cpu = trainer.strategy.root_device.type == "cpu"
        if self.keep_host_memory and on_cpu:
            keep_freed_host_memory()
        if on_cpu and self.cpu_threads is not None:
            self._set_cpu_threads(trainer)
        if stage != "fit" and self.compile:  # no EMA copy outside fit
            compile_in_place(pl_module.model)
        if stage == "fit" and trainer.strategy.root_device.type == "cuda":
            _say_few_images_per_gpu(trainer)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After every callback's setup, where Lightning's weight averaging deep-copies the module.
        if self.compile:
            compile_in_place(pl_module.model)

    def _set_cpu_threads(self, trainer: L.Trainer) -> None:
        workers = int(getattr(trainer.datamodule, "num_workers", 0) or 0)
        cpus, current = usable_cpus(), torch.get_num_threads()
        if self.cpu_threads == "auto":
            threads = training_threads(cpus, trainer.num_devices, workers, openmp_waits_briefly())
            if threads >= current:  # never more than the user, OMP_NUM_THREADS or Lightning's launcher chose
                return
        else:
            threads = int(self.cpu_threads)  # type: ignore[arg-type]
        self._threads_before = current
        torch.set_num_threads(threads)
        rank_zero_info(
            f"CPU run: {threads} torch thread(s) per process (was {current}) beside {workers} DataLoader worker(s), "
            f"{trainer.num_devices} process(es) on {cpus} usable core(s); --machine.cpu_threads sets it"
        )

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None
