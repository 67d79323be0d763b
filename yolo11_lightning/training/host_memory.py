"""Keep freed host memory in the process during CPU training (glibc's malloc).

glibc serves every allocation above its mmap threshold (at most 32 MB) with a fresh ``mmap`` and gives
it back to the OS on ``free``. A CPU training step allocates and frees the same activation tensors
every step, many of them far above 32 MB at 640 px, so every step the kernel maps and zero-fills them
again, page by page: for yolo11s at 640, batch 16, 2 million page faults and 35% of the step in the
kernel. With mmap off and trimming off, freed blocks stay in the heap and the next step reuses them
(the same idea as the jemalloc settings ``torch.backends.xeon.run_cpu`` uses). The cost: the process
keeps its peak memory until it exits, which a training process reaches every step anyway.

Process-wide, so it is switched on only when a run trains on a CPU (``training.callbacks.machine.MachineSettings``,
``--machine.keep_host_memory``); GPU training allocates activations on the device and is not affected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

log = logging.getLogger(__name__)

# mallopt parameters (glibc <malloc.h>).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4

_applied = False


def keep_freed_host_memory() -> bool:
    """Stops glibc's malloc from returning freed memory to the OS: no mmap'ed chunks, no heap trimming.

    Returns True when the settings are in effect (now or from an earlier call), False where they do not
    apply (not Linux with glibc) or glibc refused them. Safe to call many times and from any rank.
    """
    global _applied
    if _applied:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        # mallopt returns 1 on success. M_TRIM_THRESHOLD = -1 disables trimming (man 3 mallopt).
        ok = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, -1) == 1
    except (OSError, AttributeError) as e:
        log.debug("mallopt unavailable: %s", e)
        return False
    _applied = ok
    if ok:
        log.debug("glibc malloc keeps freed memory (M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1)")
    return ok
