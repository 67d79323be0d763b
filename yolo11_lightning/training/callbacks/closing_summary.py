"""ClosingSummary: what a run did, printed when fit, ``validate`` or ``test`` ends (rank 0).

It prints, and saves as ``<log_dir>/summary_<stage>.csv``, the per-class table of the newest evaluation (the
last validation of a fit; the ``validate`` or ``test`` run itself), in the task's terms::

    class      images  instances  box_P  box_R  box_mAP50  box_mAP50-95  [mask_ | pose_ P ... mAP50-95]
    class      images  instances  top1_acc  top5_acc                     (classification)

with the row ``all`` first (mAP50 and mAP50-95 there are COCO's, the values logged as ``val/mAP50`` and
``val/mAP50-95``; P and R the means over the classes with truths, read at the confidence of the best mean F1,
``metrics.class_results``). Then the best epoch and its score (``BestCheckpoint``) with what the score is (the
task's ``monitor_meaning``), the wall time, and the
folder with every file the run wrote (folders of many files as one line).
"""

from __future__ import annotations

import csv
import datetime
import logging
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from yolo11_lightning.metrics.class_results import ClassResults
from yolo11_lightning.training.callbacks.checkpoints import BestCheckpoint

log = logging.getLogger(__name__)

_STAGE_SPLIT = {"fit": "val", "validate": "val", "test": "test"}
_LISTED_FILES = 12  # a folder with more files than this (one picture per epoch) is listed as one line


class ClosingSummary(Callback):
    """The closing summary of fit, validate and test; see the module docstring."""

    def __init__(self) -> None:
        self.out_dir: Path | None = None
        self._start = time.monotonic()
        self.last_text = ""  # what was printed last, for notebooks and tests
        self._validated_epoch: int | None = None  # the epoch of a fit's last validation

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # trainer.log_dir broadcasts from rank 0: every rank must ask, never rank 0 alone (it would hang).
        self.out_dir = Path(trainer.log_dir or trainer.default_root_dir)
        self._start = time.monotonic()
        if trainer.is_global_zero and hasattr(pl_module, "keep_evaluations"):
            pl_module.keep_evaluations()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close(trainer, pl_module, "fit")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if trainer.state.fn == "fit":
            self._validated_epoch = trainer.current_epoch
        elif trainer.state.fn == "validate":
            self._close(trainer, pl_module, "validate")

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close(trainer, pl_module, "test")

    def _close(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not trainer.is_global_zero:
            return
        # Side output of rank 0 alone: a failure here must never fail a finished run.
        try:
            self._write(trainer, pl_module, stage)
        except Exception as e:  # any failure of optional output is only reported
            log.warning("ClosingSummary: could not write the summary (%s: %s)", type(e).__name__, e)

    def _write(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        out_dir = self.out_dir or Path(trainer.default_root_dir)
        split = _STAGE_SPLIT[stage]
        results = pl_module.class_results(split) if hasattr(pl_module, "class_results") else None
        wall = datetime.timedelta(seconds=round(time.monotonic() - self._start))
        lines = [f"{stage} finished in {wall} (wall)" + _progress(trainer, stage)]
        best = next((c for c in trainer.checkpoint_callbacks if isinstance(c, BestCheckpoint)), None)
        if stage == "fit" and best is not None and best.best_model_score is not None:
            epoch = f"epoch {best.best_epoch}" if best.best_epoch is not None else "best"
            task = getattr(pl_module, "task", None)
            own = best.monitor == getattr(task, "checkpoint_monitor", None)
            meaning = f" ({best.monitor.split('/')[-1]}: {task.monitor_meaning})" if own else ""
            lines.append(
                f"best: {epoch}, {best.monitor} {float(best.best_model_score):.4f}{meaning} -> {best.best_model_path}"
            )
        if results is None:
            lines.append(f"no {split} evaluation finished: no per-class results")
        else:
            where = f"last validation (epoch {self._validated_epoch})" if stage == "fit" else f"{split} split"
            rows = class_rows(results)
            confidences = ", ".join(f"{k} {r.best_confidence:.3f}" for k, r in results.kinds.items())
            at = f"; P and R at confidence {confidences} (best mean F1)" if confidences else ""
            lines.append(f"per class, {where}, {results.num_images} images{at}:")
            lines.extend(_format_table(rows))
            out_dir.mkdir(parents=True, exist_ok=True)
            with open(out_dir / f"summary_{stage}.csv", "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(rows[0].keys())
                writer.writerows(row.values() for row in rows)
        lines.append(f"results in {out_dir.resolve()}:")
        lines.extend(f"  {entry}" for entry in _listing(out_dir, trainer))
        self.last_text = "\n".join(lines)
        rank_zero_info(self.last_text)


def class_rows(results: ClassResults) -> list[dict[str, Any]]:
    """Returns the table's rows, all then each class; per kind P, R, mAP50, mAP50-95, NaN without truths."""
    rows = [{"class": "all", "images": results.num_images, "instances": int(results.instances.sum())}]
    for kind, r in results.kinds.items():
        rows[0].update({f"{kind}_P": r.mean(r.p), f"{kind}_R": r.mean(r.r), f"{kind}_mAP50": r.map50,
                        f"{kind}_mAP50-95": r.map50_95})  # fmt: skip
    for measure, (overall, _) in results.accuracy.items():
        rows[0][f"{measure}_acc"] = overall
    for i, name in enumerate(results.names):
        row: dict[str, Any] = {
            "class": name,
            "images": int(results.images[i]),
            "instances": int(results.instances[i]),
        }
        for kind, r in results.kinds.items():
            row.update({f"{kind}_P": float(r.p[i]), f"{kind}_R": float(r.r[i]), f"{kind}_mAP50": float(r.ap50[i]),
                        f"{kind}_mAP50-95": float(r.ap50_95[i])})  # fmt: skip
        for measure, (_, per_class) in results.accuracy.items():
            row[f"{measure}_acc"] = float(per_class[i])
        rows.append(row)
    return rows


def _format_table(rows: list[dict[str, Any]]) -> list[str]:
    """Formats the rows as aligned text, NaN shown as a dash."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return "-" if np.isnan(value) else f"{value:.3f}"
        return str(value)

    header = list(rows[0])
    table = [header, *([cell(row[k]) for k in header] for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    return [
        "  ".join(text.ljust(w) if i == 0 else text.rjust(w) for i, (text, w) in enumerate(zip(line, widths)))
        for line in table
    ]


def _progress(trainer: L.Trainer, stage: str) -> str:
    if stage != "fit":
        return ""
    epochs, steps = trainer.current_epoch, trainer.global_step
    return f": {epochs} epoch{'s' * (epochs != 1)}, {steps} optimiser step{'s' * (steps != 1)}"


def _listing(out_dir: Path, trainer: L.Trainer) -> list[str]:
    """Lists every file under ``out_dir`` and the checkpoint folders outside it, with its size.

    A folder of more than ``_LISTED_FILES`` files is one line.
    """
    folders = [out_dir]
    for callback in trainer.checkpoint_callbacks:
        dirpath = getattr(callback, "dirpath", None)
        if dirpath and not Path(dirpath).resolve().is_relative_to(out_dir.resolve()):
            folders.append(Path(dirpath))
    entries = []
    for folder in dict.fromkeys(folders):
        if not folder.is_dir():
            continue
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        by_parent: dict[Path, list[Path]] = {}
        for path in files:
            by_parent.setdefault(path.parent, []).append(path)
        for parent, paths in by_parent.items():
            shown = parent.relative_to(folder) if folder == out_dir else parent
            if len(paths) > _LISTED_FILES:
                size = sum(p.stat().st_size for p in paths)
                entries.append(f"{shown}/ ({len(paths)} files, {_size(size)})")
                continue
            for path in paths:
                name = path.relative_to(folder) if folder == out_dir else path
                entries.append(f"{name} ({_size(path.stat().st_size)})")
    return entries


def _size(size: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size} B"
