"""End the ranks this process launched when the run fails here, instead of leaving them waiting in a collective."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time

from lightning.pytorch import Trainer
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher


def end_launched_ranks(trainer: Trainer, grace_seconds: float = 0.0) -> None:
    """SIGKILL the ranks this process launched (Lightning's own launcher, ``devices > 1`` without torchrun).

    Lightning ends them itself only on Ctrl+C, or when one of them exits with an error. When this process
    fails instead, e.g. a collective timed out because another rank hangs, the launched ranks would be
    left behind holding their devices. Under torchrun or srun the launcher does this job. With
    ``grace_seconds``, ranks still running after that long are the ones ended.
    """
    launcher = getattr(trainer.strategy, "launcher", None)
    if not isinstance(launcher, _SubprocessScriptLauncher):
        return
    deadline = time.monotonic() + grace_seconds
    for proc in launcher.procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
    launcher.kill(signal.SIGKILL)
