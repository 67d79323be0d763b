"""Silence the Lightning messages whose premise does not hold here, and only those."""

from __future__ import annotations

import logging
import warnings

from lightning.pytorch.utilities.warnings import PossibleUserWarning


class _WithoutCloudTips(logging.Filter):
    """Lightning 2.6 advertises its cloud services (LitLogger, LitModels) at Trainer starts: lines no run needs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip: For seamless cloud")


def silence_lightning_noise() -> None:
    """Installs the filters once, when training.module is imported."""
    # Lightning advises sync_dist=True for epoch-level logs under DDP; the evaluation metrics are global already.
    warnings.filterwarnings(
        "ignore", message=r"It is recommended to use `self\.log\('(val|test)/", category=PossibleUserWarning
    )
    # Lightning 2.6 tests `isinstance(spec, LeafSpec)`, which torch deprecates since 2.9: a warning at every start
    # that no user can act on (Lightning's to change). Only that message is silenced.
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_WithoutCloudTips())


def trust_restored_sampler() -> None:
    """Silences Lightning's warning that a resume inside an epoch is unreliable because the DataLoader keeps no
    state: called once ``YOLODataModule`` restored its sampler's position, which makes that resume exact."""
    warnings.filterwarnings(
        "ignore",
        message=r"You're resuming from a checkpoint that ended before the epoch ended and your dataloader is",
        category=PossibleUserWarning,
    )
