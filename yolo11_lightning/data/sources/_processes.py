"""``ordered_map``: a function over items in worker processes, results in the items' order.

For the label check (``yolo.load_yolo_images``), whose per-image parsing holds the GIL. Workers are forked where
the platform allows (as DataLoader workers are): they start at once and inherit the imported modules; elsewhere
spawned. One worker, one item, or a daemonic caller runs in this process.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def ordered_map(fn: Callable[[Any], T], items: Sequence[Any], workers: int) -> Iterator[T]:
    """``map(fn, items)`` on ``min(workers, len(items))`` processes; ``fn`` and items must pickle."""
    workers = min(workers, len(items))
    if workers <= 1 or multiprocessing.current_process().daemon:  # a daemon (a loader worker) has no children
        yield from map(fn, items)
        return
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method)) as pool:
        yield from pool.map(fn, items)
