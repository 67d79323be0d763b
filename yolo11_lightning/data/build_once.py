"""Global rank 0 builds (the label cache of a split), every other rank waits for it without a timeout.

Checking a million images takes minutes. Waiting for that inside a collective (a barrier, or the ranks'
data agreement) would hit the process group's timeout, so ``run_once_per_node`` waits outside any collective:

1. global rank 0 runs the work (``load_split``: check the split and write its cache, or read a valid cache), then
   sets a key in the process group's store (``ok``, or ``error`` and its one-line message);
2. the local rank 0 of every other node waits for that key by polling the store (``Store.check``: an answer
   at once, never a timeout), then runs the same work: it reads rank 0's cache when the node sees the same
   file (a shared filesystem: the cache is built once per dataset), or builds its own (a node-local copy), then
   sets its node's key;
3. every other rank waits for its node's key, then runs the work, which now reads the cache.

A rank whose awaited rank failed raises the same one-line message (``DatasetError``), so every rank stops with
the error instead of waiting. A rank that dies while the others wait takes the store with it (global rank 0
hosts it, or torchrun's agent ends the job): the waiters' ``check`` then fails and they raise. The ranks'
data agreement (``agreement.check_ranks_agree``) runs after this, as before. Without torch.distributed the
work just runs.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from yolo11_lightning.data.images.node_cache import RankGroup
from yolo11_lightning.data.sources.config import DatasetError

T = TypeVar("T")
log = logging.getLogger(__name__)

_calls = (
    itertools.count()
)  # every rank calls in the same order, so the n-th call has the same keys everywhere
_OK, _ERROR = b"ok", b"error\n"
# The pause between two looks at the store: 1/20 of the time waited so far (a waiter learns of the end at most 5%
# late), at least SHORTEST_POLL_S, at most LONGEST_POLL_S (a million-image build: one look a second per rank).
SHORTEST_POLL_S, LONGEST_POLL_S, POLL_SHARE = 0.005, 1.0, 0.05
REPORT_EVERY_S = 60.0  # a waiting rank logs that it still waits this often


def _store() -> Any:
    """The default process group's store (the one its ranks met through)."""
    return torch.distributed.distributed_c10d._get_default_store()


def wait_for_key(store: Any, key: str, what: str) -> None:
    """Poll ``store`` until ``key`` is set, with no timeout; raise DatasetError with its message on ``error``.

    ``what`` names the awaited work in the log lines and errors. A store that cannot be reached any more (its
    host died) raises RuntimeError.
    """
    start, reported = time.monotonic(), 0.0
    while True:
        try:
            ready = store.check([key])
        except Exception as e:  # the store's host is gone (rank 0 or the launcher's agent)
            raise RuntimeError(f"lost the process group's store while waiting for {what}: {e}") from e
        if ready:
            break
        waited = time.monotonic() - start
        if waited - reported >= REPORT_EVERY_S:
            reported = waited
            log.info("still waiting for %s (%.0f s)", what, waited)
        time.sleep(min(max(waited * POLL_SHARE, SHORTEST_POLL_S), LONGEST_POLL_S))
    value = store.get(key)  # set: answers at once
    if value.startswith(_ERROR):
        raise DatasetError(value[len(_ERROR) :].decode("utf-8", "replace"))


def _run_and_publish(store: Any, keys: list[str], work: Callable[[], T]) -> T:
    try:
        result = work()
    except BaseException as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        for key in keys:
            store.set(key, _ERROR + message.encode("utf-8", "replace"))
        raise
    for key in keys:
        store.set(key, _OK)
    return result


def run_once_per_node(group: RankGroup, name: str, work: Callable[[], T]) -> T:
    """``work()`` on every rank: first on global rank 0, then on each node's local rank 0, then on the rest.

    Every rank of the job calls it, in the same order with the same ``name`` (words for the log). The waits
    poll the store (module docstring): no collective, so no timeout, however long the work takes.
    """
    call = next(_calls)
    if group.world == 1 or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return work()
    store = _store()
    node_key = lambda node: f"yolo11_lightning/run_once/{call}/node{node}"  # noqa: E731
    if group.rank == 0:
        return _run_and_publish(store, [node_key(0), node_key(group.node_rank)], work)
    if group.local_rank == 0:

        def after_rank_0() -> T:  # rank 0's error is passed on to this node's ranks too
            wait_for_key(store, node_key(0), f"rank 0: {name}")
            return work()

        return _run_and_publish(store, [node_key(group.node_rank)], after_rank_0)
    wait_for_key(store, node_key(group.node_rank), f"the local rank 0 of node {group.node_rank}: {name}")
    return work()
