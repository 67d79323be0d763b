"""The per-sample random streams: augmentation generators, unreadable-image substitutes, partner strides.

Each is a pure function of (seed, epoch, index, ...), so every worker, rank and resumed run agrees.
"""

from __future__ import annotations

import numpy as np

# First entropy word of the per-sample generators; the sampler's epoch order uses another one.
SAMPLE_STREAM = 1
# First entropy word of the generator choosing the substitute of an unreadable training image.
SUBSTITUTE_STREAM = 2
# Fewest samples a mosaic partner pool holds when the global batch allows (diversity of the mosaics).
MIN_PARTNER_POOL = 16


def partner_stride(global_batch_size: int) -> int:
    """The largest power of two S with at least ``MIN_PARTNER_POOL`` samples per pool (B / S), or 1.

    Rank r holds positions r (mod R); a pool of positions congruent modulo S is on one rank whenever R
    divides S. Global batches are usually R x (16 or more) with R a power of two, so S is a multiple of R.
    """
    stride = 1
    while global_batch_size // (2 * stride) >= MIN_PARTNER_POOL:
        stride *= 2
    return stride


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of one sample's augmentation: a function of (seed, epoch, index) only."""
    return np.random.default_rng([SAMPLE_STREAM, seed, epoch, index])


def substitute_index(seed: int, epoch: int, index: int, attempt: int, num_images: int) -> int:
    """Candidate ``attempt`` (0, 1, ...) to stand in for unreadable image ``index`` in ``epoch``.

    A function of its arguments only, never ``index`` itself: every worker, rank and resumed run picks
    the same substitute as long as the same files are unreadable.
    """
    if num_images < 2:
        raise ValueError("a dataset of one image has no substitute for it")
    j = int(np.random.default_rng([SUBSTITUTE_STREAM, seed, epoch, index, attempt]).integers(num_images - 1))
    return j + (j >= index)
