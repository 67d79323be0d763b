"""Old import path of ``training.lightning_cli`` (LightningCLI), kept so that existing code keeps working.

"cli" now means one thing, the ``yolo11-lightning`` dispatcher in ``yolo11_lightning/cli.py``; the
LightningCLI subclass and ``default_callbacks`` live in ``training/lightning_cli.py``.
"""

from yolo11_lightning.training.lightning_cli import (
    TRAINER_DEFAULTS,
    YOLOLightningCLI,
    default_callbacks,
    end_launched_ranks,
    run_lightning_cli,
)

__all__ = [
    "TRAINER_DEFAULTS",
    "YOLOLightningCLI",
    "default_callbacks",
    "end_launched_ranks",
    "run_lightning_cli",
]
