"""Every export format per task: metric difference from the checkpoint, latency, file size; INT8 against calibration size.

For each checkpoint given (``TASK=CKPT=DATA``, a tiny model trained briefly on a synthetic set) it runs
``yolo11-lightning benchmark`` (every format exported, validated with the checkpoint's validator, timed at batch 1
and 8 on this machine) and then exports ``onnx-int8`` and ``openvino-int8`` with several calibration sizes and
scores each. Prints Markdown; the figures recorded are in deploy.md beside this script.

    python benchmarks/deploy/deploy.py detect=runs/d/best.ckpt=datasets/d/data.yaml ... --calibration 4 16 64
"""

from __future__ import annotations

import argparse
import contextlib
import io
import platform
from pathlib import Path

import torch

from yolo11_lightning.cli.benchmark import main as benchmark
from yolo11_lightning.export.calibration import calibration_images
from yolo11_lightning.export.check import compare
from yolo11_lightning.export.formats import FORMATS, export_file, output_path
from yolo11_lightning.model_files.image_size import file_image_size
from yolo11_lightning.model_files.weights import load_model
from yolo11_lightning.tasks import get_task


def _int8_sweep(ckpt: str, data: str, sizes: list[int], out: Path) -> list[str]:
    model = load_model(ckpt, task=None)
    size = file_image_size(ckpt) or 640
    metric = get_task(model.task).checked_metrics[0]
    rows, reference = [], None
    for count in sizes:
        images = calibration_images(data, model.task, size, count)
        for name in ("onnx-int8", "openvino-int8"):
            fmt = FORMATS[name]
            path = export_file(
                fmt, model, output_path(fmt, out / f"cal{count}.pt"), (size, size), calibration=images
            )
            with contextlib.redirect_stdout(io.StringIO()):
                check = compare(model, path, data, (size, size), False, batch_size=16, num_workers=0,
                                accelerator="cpu", label=name, checkpoint=reference)  # fmt: skip
            reference = check.checkpoint
            rows.append(f"| {model.task} | {name} | {len(images)} | {check.checkpoint[metric]:.4f} | "
                        f"{check.exported[metric]:.4f} | {check.difference(metric):+.4f} |")  # fmt: skip
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="TASK=CKPT=DATA")
    p.add_argument("--calibration", type=int, nargs="+", default=[4, 16, 64])
    p.add_argument("--out", default="runs/deploy_benchmark")
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread\n")
    sweeps = []
    for run in args.runs:
        task, ckpt, data = run.split("=")
        out = Path(args.out) / task
        benchmark(["--model", ckpt, "--data", data, "--out", str(out), "--calibration-images", "64"])
        sweeps += _int8_sweep(ckpt, data, args.calibration, out / "sweep")
    print(
        "\n| task | format | calibration images | checkpoint | INT8 | difference |\n|---|---|---|---|---|---|"
    )
    print("\n".join(sweeps))


if __name__ == "__main__":
    main()
