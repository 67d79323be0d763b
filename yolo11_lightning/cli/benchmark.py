"""``yolo11-lightning benchmark``: export a checkpoint to every format, score and time each file.

    yolo11-lightning benchmark --model runs/.../best.ckpt --data data.yaml

For each format of ``export.formats.FORMATS`` (``--formats`` to choose): export beside ``--out``, validate the
file on the dataset's val split with the checkpoint's validator (``export.check.compare``: square letterboxing at
the export size, as ``export --check-data``), and time its runtime on random images at batch 1 and at
``--batch``. The checkpoint itself is the first row (PyTorch). Prints a Markdown table and writes
``benchmark.csv``, ``benchmark.md`` and ``benchmark.png`` (latency against the metric) into ``--out``. A format
whose runtime is not installed is a row naming the extra; one that fails is a row with its error.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import torch

from yolo11_lightning.errors import UserInputError
from yolo11_lightning.export.calibration import calibration_images
from yolo11_lightning.export.check import compare
from yolo11_lightning.export.formats import FORMATS, export_file, get_format, missing_extra, output_path
from yolo11_lightning.model_files.exported_files import open_exported
from yolo11_lightning.model_files.image_size import choose_image_size, file_image_size
from yolo11_lightning.model_files.weights import load_model
from yolo11_lightning.plots.latency_accuracy import latency_accuracy
from yolo11_lightning.tasks import get_task

__all__ = ["BenchmarkRow", "main"]

COLUMNS = ("format", "size_mb", "latency_ms_b1", "latency_ms_batch", "metric", "value", "difference", "note")


@dataclass
class BenchmarkRow:
    """One format's line of the table (a missing runtime or an error: ``note`` only)."""

    format: str
    size_mb: float | None = None
    latency_ms_b1: float | None = None
    latency_ms_batch: float | None = None
    metric: str = ""
    value: float | None = None
    difference: float | None = None
    note: str = ""

    def cells(self) -> list[str]:
        """The row as text cells, in ``COLUMNS`` order (empty where unknown)."""
        shown = {
            "size_mb": "" if self.size_mb is None else f"{self.size_mb:.2f}",
            "latency_ms_b1": "" if self.latency_ms_b1 is None else f"{self.latency_ms_b1:.2f}",
            "latency_ms_batch": "" if self.latency_ms_batch is None else f"{self.latency_ms_batch:.2f}",
            "value": "" if self.value is None else f"{self.value:.4f}",
            "difference": "" if self.difference is None else f"{self.difference:+.4f}",
        }
        return [shown.get(c, str(getattr(self, c))) for c in COLUMNS]


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="yolo11-lightning benchmark",
        description="Export a checkpoint to each installed format; score, time and size every file.",
    )
    p.add_argument(
        "--model", "--ckpt_path", dest="model", required=True, help="Lightning .ckpt or weights file"
    )
    p.add_argument("--data", required=True, help="dataset yaml (or 'synthetic'): scored on its val split")
    p.add_argument(
        "--formats", default=",".join(FORMATS), help=f"comma-separated (default: {','.join(FORMATS)})"
    )
    p.add_argument("--image-size", "--image_size", dest="image_size", type=int, default=None,
                   help="square export size (default: the size the model was trained at)")  # fmt: skip
    p.add_argument("--batch", type=int, default=8, help="the second timed batch size (default 8)")
    p.add_argument("--runs", type=int, default=20, help="timed calls per batch size (default 20)")
    p.add_argument("--calibration-images", dest="calibration_images", type=int, default=64,
                   help="INT8 calibration images from the training split (default 64)")  # fmt: skip
    p.add_argument("--out", default=None, help="folder for the files and tables (default: beside the model)")
    p.add_argument(
        "--num-workers", dest="num_workers", type=int, default=0, help="validation loader processes"
    )
    p.add_argument("--accelerator", default="cpu", help="Lightning accelerator for validation (default cpu)")
    return p.parse_args(argv)


def _latency(run: Callable[[torch.Tensor], object], size: int, batch: int, runs: int) -> float:
    """Median milliseconds per image of ``run`` on random (batch, 3, size, size) images after two warm-up calls."""
    images = torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(0))
    times = []
    with torch.inference_mode():
        for i in range(runs + 2):
            start = time.perf_counter()
            run(images)
            if i >= 2:
                times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[len(times) // 2] / batch


def _size_mb(path: Path) -> float:
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files) / 1e6


def main(argv: Sequence[str] | None = None) -> int:
    """``yolo11-lightning benchmark``; returns the exit code."""
    args = _parse(argv)
    try:
        formats = [get_format(name.strip()) for name in args.formats.split(",") if name.strip()]
        model = load_model(args.model, task=None)
    except (UserInputError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    source = Path(args.model)
    size, said = choose_image_size(args.image_size, file_image_size(source))
    print(said)
    out = Path(args.out) if args.out else source.parent / f"{source.stem}_benchmark"
    out.mkdir(parents=True, exist_ok=True)
    metric = get_task(model.task).checked_metrics[0]
    common = {"batch_size": 16, "num_workers": args.num_workers, "accelerator": args.accelerator}
    reference = None  # the checkpoint's metrics, validated with the first file
    rows: list[BenchmarkRow] = []
    calibration = None
    eager = model.eval()
    torch_row = BenchmarkRow(
        "pytorch", _size_mb(source), _latency(eager, size, 1, args.runs), _latency(eager, size, args.batch, args.runs),
        metric, note="the checkpoint",
    )  # fmt: skip
    for fmt in formats:
        problem = missing_extra(fmt)
        if problem is not None:
            rows.append(BenchmarkRow(fmt.name, note=problem))
            print(f"{fmt.name}: {problem}")
            continue
        try:
            if fmt.calibrated and calibration is None:
                calibration = calibration_images(args.data, model.task, size, args.calibration_images)
            path = export_file(
                fmt, model, output_path(fmt, out / source.name), (size, size), calibration=calibration
            )
            check = compare(
                model, path, args.data, (size, size), False, label=fmt.name, checkpoint=reference, **common
            )
            reference = check.checkpoint
            runner = open_exported(path, model.num_classes, task=model.task)
            rows.append(BenchmarkRow(
                fmt.name, _size_mb(path), _latency(runner, size, 1, args.runs),
                _latency(runner, size, args.batch, args.runs), metric, check.exported[metric],
                check.difference(metric), fmt.precision,
            ))  # fmt: skip
        except (UserInputError, ValueError, RuntimeError, ImportError) as e:
            rows.append(BenchmarkRow(fmt.name, note=f"error: {str(e).splitlines()[0]}"))
        print(f"{fmt.name}: done")
    if reference is not None:
        torch_row.value, torch_row.difference = reference[metric], 0.0
    rows.insert(0, torch_row)
    _write(rows, out, f"{source.name}, {model.task}, {size} px, batch {args.batch}", args.batch)
    return 0


def _write(rows: list[BenchmarkRow], out: Path, title: str, batch: int) -> None:
    """Print the Markdown table; write it, the csv and the picture into ``out``."""
    header = [c.replace("latency_ms_batch", f"latency_ms_b{batch}") for c in COLUMNS]
    lines = [f"| {' | '.join(header)} |", f"|{'---|' * len(header)}"]
    lines += [f"| {' | '.join(r.cells())} |" for r in rows]
    table = f"{title}\n\n" + "\n".join(lines) + "\n"
    print(table)
    (out / "benchmark.md").write_text(table)
    with (out / "benchmark.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(r.cells() for r in rows)
    scored = [r for r in rows if r.value is not None and r.latency_ms_b1 is not None]
    image = latency_accuracy(
        [r.format for r in scored], [r.latency_ms_b1 for r in scored], [r.value for r in scored],
        scored[0].metric if scored else "metric", title,
    )  # fmt: skip
    cv2.imwrite(str(out / "benchmark.png"), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    print(f"wrote {out / 'benchmark.md'}, benchmark.csv, benchmark.png")
