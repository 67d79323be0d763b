"""``ShardWindows``: the shard-aware epoch order of a shard folder's training split.

The epoch's permutation (``sampler.epoch_order``) is drawn from ``(seed, epoch)`` only, as for a folder, but in
two steps: the shards are shuffled, then cut into windows of ``window`` consecutive shards of that shuffle, and
the samples of each window are shuffled among themselves. Rank r of R still takes positions r, r + R, ... of it,
so at any moment every rank reads from the same few shards (a window), each shard is fetched once per node per
epoch while it is in use, and the order is the same for any world size and worker count: a mid-epoch resume
on another world size continues exactly, as with folders.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_SHARD_WINDOW = 16  # shards whose samples the training order shuffles together (``data.shard_window``)


@dataclass(frozen=True, eq=False)
class ShardWindows:
    """Samples grouped by shard (``shard_of``: (N,) the shard of each sample); ``window`` shards shuffled together."""

    shard_of: np.ndarray
    window: int

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"a shuffle window holds at least 1 shard, got {self.window}")

    @property
    def name(self) -> str:
        """How a checkpoint's sampler state names this order (a resume must use the same)."""
        return f"shards/{self.window}"

    def permutation(self, rng: np.random.Generator) -> np.ndarray:
        """(N,) int64: the samples, shard windows in a shuffled shard order, shuffled within each window."""
        shards = int(self.shard_of.max()) + 1 if len(self.shard_of) else 0
        place = np.empty(shards, np.int64)
        place[rng.permutation(shards)] = np.arange(shards)  # each shard's place in the shuffled shard order
        window = place[self.shard_of] // self.window
        return np.lexsort((rng.random(len(self.shard_of)), window)).astype(np.int64)
