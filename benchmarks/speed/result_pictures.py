"""What the result pictures and the closing summary cost, beside the validation they are drawn from.

    python benchmarks/speed/result_pictures.py   # a briefly trained yolo11n, 64 and 512 images
    python benchmarks/speed/result_pictures.py --ckpt runs/quickstart/lightning_logs/version_0/checkpoints/best.ckpt

Per validation set size, in one process, alternating rounds: ``Trainer.validate`` without our callbacks, and
with ``ResultPictures`` and ``ClosingSummary`` (the difference is what a ``validate`` run pays for them: COCO's
extended summary, the per-class results, the eight pictures and the table); then, on the same evaluation, the
parts alone: the per-class results (matching, confusion matrix), the evaluation pictures, and the training
curves of a 100-epoch history (what every epoch end pays during fit). Without ``--ckpt`` a yolo11n is trained
for a few epochs on the synthetic set first, so that the detections are those of a model that finds things.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import lightning as L
import numpy as np

from yolo11_lightning.metrics.class_results import class_results
from yolo11_lightning.plots.evaluation import confidence_curve_image, confusion_matrix_image, pr_curve_image
from yolo11_lightning.plots.training_curves import training_curves
from yolo11_lightning.synthetic.shapes import make_synthetic_dataset
from yolo11_lightning.training.callbacks.closing_summary import ClosingSummary
from yolo11_lightning.training.callbacks.result_pictures import ResultPictures
from yolo11_lightning.training.datamodule import YOLODataModule
from yolo11_lightning.training.module import YOLO11Module


def _trainer(root: Path, callbacks: list) -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=str(root), callbacks=callbacks)  # fmt: skip


def _train(workdir: Path, image_size: int) -> Path:
    dataset = make_synthetic_dataset(workdir / "train_set", num_train=256, num_val=16, image_size=image_size)
    trainer = L.Trainer(accelerator="cpu", max_epochs=8, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(workdir / "train"), num_sanity_val_steps=0,
                        limit_val_batches=0)  # fmt: skip
    module = YOLO11Module(num_classes=3, optimizer="SGD", lr0=0.01, warmup_epochs=1.0, log_images=0)
    trainer.fit(module, datamodule=YOLODataModule(dataset=str(dataset), image_size=image_size, batch_size=16))
    path = workdir / "trained.ckpt"
    trainer.save_checkpoint(path)
    return path


def _time(fn, rounds: int) -> float:
    """Median seconds of ``fn`` over ``rounds`` calls."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(ckpt: Path, workdir: Path, images: int, image_size: int, rounds: int) -> dict[str, float]:
    dataset = make_synthetic_dataset(workdir / f"val_{images}", num_train=4, num_val=images, image_size=image_size,
                                     seed=1)  # fmt: skip
    data = YOLODataModule(dataset=str(dataset), image_size=image_size, batch_size=16, num_workers=0)
    module = YOLO11Module.load_from_checkpoint(ckpt, map_location="cpu", log_images=0)
    plain, pictured = [], []
    for r in range(rounds):  # alternating, so that machine load falls on both alike
        for callbacks, into in (([], plain), ([ResultPictures(), ClosingSummary()], pictured)):
            trainer = _trainer(workdir / f"run_{images}_{r}_{len(callbacks)}", callbacks)
            start = time.perf_counter()
            trainer.validate(module, datamodule=data, verbose=False)
            into.append(time.perf_counter() - start)
    evaluation = module.val_map.evaluation
    names = list(module.hparams.class_names or ["0", "1", "2"])
    results = class_results(evaluation, names)

    def pictures() -> None:
        confusion_matrix_image(results.confusion, names, False)
        confusion_matrix_image(results.confusion, names, True)
        box = results.kinds["box"]
        pr_curve_image(box, names)
        for which in ("f1", "precision", "recall"):
            confidence_curve_image(box, names, which)

    keys = [
        "train/box_loss",
        "train/cls_loss",
        "train/dfl_loss",
        "val/mAP50-95",
        "val/mAP50",
        *(f"lr/pg{i}" for i in range(3)),
    ]
    history = {k: {e: float(np.sin(e / 7) + 1) for e in range(100)} for k in keys}
    return {
        "validate (s)": statistics.median(plain),
        "validate + pictures + summary (s)": statistics.median(pictured),
        "per-class results (ms)": 1000 * _time(lambda: class_results(evaluation, names), rounds),
        "evaluation pictures (ms)": 1000 * _time(pictures, rounds),
        "training curves, 100 epochs (ms)": 1000 * _time(lambda: training_curves(history), rounds),
        "detections": float(len(evaluation.scores)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt", type=Path, help="a detection checkpoint (default: train a yolo11n briefly)")
    parser.add_argument("--images", type=int, nargs="+", default=[64, 512], help="validation set sizes")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(C.machine_info())
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        ckpt = args.ckpt or _train(workdir, args.image_size)
        rows = {n: measure(ckpt, workdir, n, args.image_size, args.rounds) for n in args.images}
    keys = list(next(iter(rows.values())))
    print("| | " + " | ".join(f"{n} images" for n in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for key in keys:
        print(f"| {key} | " + " | ".join(f"{rows[n][key]:.3g}" for n in rows) + " |")
    for n, row in rows.items():
        extra = row["validate + pictures + summary (s)"] - row["validate (s)"]
        print(
            f"{n} images: pictures and summary add {1000 * extra:.0f} ms to a {row['validate (s)']:.2f} s validation"
        )


if __name__ == "__main__":
    main()
