"""The CPU allocator setting (training.host_memory): freed activations are reused, not re-faulted."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import lightning as L
import pytest

from yolo11_lightning import YOLO11Module
from yolo11_lightning.training import module as module_file
from yolo11_lightning.training.callbacks.machine import MachineSettings

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc malloc only"
)

# Allocate, touch and free a 64 MB tensor (above glibc's largest mmap threshold) 16 times; print the page
# faults of the last 6 as a fraction of the tensor's pages. With the setting the heap settles within a few
# rounds (glibc's bins take the first freed blocks) and then serves the block again with no fault.
_FAULTS = textwrap.dedent(
    """
    import resource, sys, torch
    from yolo11_lightning.training.host_memory import keep_freed_host_memory
    if sys.argv[1] == "keep":
        assert keep_freed_host_memory() and keep_freed_host_memory()  # idempotent
    pages = 64 * 2**20 // resource.getpagesize()
    def touch():
        x = torch.empty(16 * 2**20, dtype=torch.float32)
        x.fill_(1.0)
        del x
    for _ in range(10):
        touch()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(6):
        touch()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / (6 * pages))
    """
)


def _faults_per_page(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


@glibc
def test_freed_memory_is_reused_instead_of_faulted_in_again() -> None:
    default, kept = _faults_per_page("default"), _faults_per_page("keep")
    assert default > 0.5, f"glibc's default should re-fault a 64 MB block each time ({default:.2f}/page)"
    assert kept < 0.05, f"with the setting the block should be reused ({kept:.2f} faults/page)"


@pytest.mark.parametrize(("settings", "expected"), [(None, 1), (False, 0)])
def test_the_module_applies_it_when_running_on_cpu(monkeypatch, settings: bool | None, expected: int) -> None:
    """A Trainer without ``MachineSettings`` gets its default (on); with the callback, the callback decides."""
    calls: list[int] = []
    monkeypatch.setattr(module_file, "keep_freed_host_memory", lambda: calls.append(1) or True)
    module = YOLO11Module(scale="n", num_classes=3, log_images=0)
    module.setup("fit")  # by hand, no Trainer: nothing to decide on
    assert calls == []
    callbacks = [] if settings is None else [MachineSettings(keep_host_memory=settings)]
    module.trainer = L.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, callbacks=callbacks
    )
    module.setup("fit")
    assert len(calls) == expected
