"""Validation speed: images/s of our validation loop (forward, NMS, mAP) beside the oracle's validator.

    python benchmarks/speed/val_speed.py                        # yolo11n, 64 images at 320; about 2 minutes
    python benchmarks/speed/val_speed.py --image-size 640 --images 128 --rounds 3
    python benchmarks/speed/val_speed.py --rect --non-square      # rectangular vs square batches, both sides

Both sides validate the same synthetic images with the same weights: a reference ``DetectionModel``
built with a fixed seed, its BatchNorm statistics measured on the images and its class biases set so
that about ``--candidates`` (anchor, class) pairs per image score above the 0.001 threshold (the load
NMS and the metric see in early training; see ``make_weights``), converted to ours with
``load_model``. Ours is ``Trainer.validate`` (letterbox, uint8 batches, the module's NMS,
the torchmetrics/faster-coco-eval mAP); the oracle is ultralytics' ``DetectionValidator`` called with the
model (it fuses Conv+BN first). Timed from the loop start to the end of the mAP computation, the same
torch threads, 0 loader workers (the oracle forces 0 on CPU). Each run is a fresh process, rounds
alternate; both mAPs are printed as a cross-check (same weights, same data: they should be close).

``--rect`` adds both sides in rectangular batches (ours: ``--data.rect_val true``, our default; the
oracle: ``rect=True``, the default of its ``model.val``) beside the square ones; ``--non-square`` validates
images of several aspect ratios (``val_parity.non_square_yaml``) instead of square ones, where rectangular
batches have fewer pixels to process than squares (on square images they have more: the reference's
half-stride pad makes a 320 square 352).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import torch

from yolo11_lightning.model_files.weights import load_model, save_weights


def make_weights(
    workdir: Path, scale: str, yaml: Path, image_size: int, candidates: int
) -> tuple[Path, Path, float]:
    """The reference model (for the oracle) and our weights file with identical numbers.

    An untrained network's features fade layer by layer (BN running statistics are still 0/1), so every
    anchor gets the same score. BN statistics are first measured on the validation images (cumulative
    average, one pass in train mode), which gives varied features; then the class biases are set so that
    about ``candidates`` (anchor, class) pairs per image score above 0.001 - the load that NMS and the
    metric see in early training. Returns (oracle .pt, our weights file, class bias).
    """
    from torch import nn
    from ultralytics.nn.tasks import DetectionModel

    from yolo11_lightning import YOLODataModule

    data = YOLODataModule(
        dataset=str(yaml), batch_size=16, image_size=image_size, num_workers=0, rect_val=False
    )
    data.setup("validate")
    images = [b["images"].float() / 255 for b in data.val_dataloader()]
    torch.manual_seed(0)
    ref = DetectionModel(f"yolo11{scale}.yaml", nc=data.num_classes, verbose=False)
    norms = [m for m in ref.modules() if isinstance(m, nn.BatchNorm2d)]
    with torch.no_grad():
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the pass
        ref.train()
        for x in images:
            ref(x)
        for m in norms:
            m.momentum = 0.03
        ref.eval()
        heads = [branch[-1] for branch in ref.model[-1].cv3]  # the class branches' last 1x1 convs
        for head in heads:
            head.bias.zero_()
        scores = torch.cat([ref(x)[0][:, 4:] for x in images])  # (N, nc, A) sigmoid scores
        logits = torch.logit(scores.double().clamp(1e-12, 1 - 1e-12))
        share = min(candidates / logits[0].numel(), 1.0)
        bias = float(torch.logit(torch.tensor(0.001, dtype=torch.float64)) - logits.quantile(1 - share))
        for head in heads:
            head.bias.fill_(bias)
    ref_path, ours_path = (
        workdir / f"ref_{scale}_{image_size}.pt",
        workdir / f"ours_{scale}_{image_size}.weights",
    )
    torch.save({"model": ref, "train_args": {}}, ref_path)
    save_weights(load_model(ref.state_dict()), ours_path)
    return ref_path, ours_path, bias


def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    import lightning as L

    from yolo11_lightning import YOLO11Module, YOLODataModule

    torch.set_num_threads(args.threads)
    data = YOLODataModule(
        dataset=args.yaml,
        batch_size=args.batch,
        image_size=args.image_size,
        num_workers=0,
        rect_val=args.rect_batches,
    )
    module = YOLO11Module(
        scale=args.scale, num_classes=data.num_classes, class_names=data.class_names, weights=args.weights,
        log_images=0, channels_last=not args.nchw,
    )  # fmt: skip
    clock: dict[str, float] = {}

    class Clock(L.Callback):
        def on_validation_start(self, trainer, pl_module) -> None:
            clock["start"] = time.perf_counter()

        def on_validation_end(self, trainer, pl_module) -> None:
            clock["end"] = time.perf_counter()

    trainer = L.Trainer(
        accelerator="auto", devices=1, logger=False, callbacks=[Clock()], enable_model_summary=False,
        enable_progress_bar=True,
    )  # fmt: skip
    metrics = trainer.validate(module, data, verbose=False)[0]
    images = len(data.datasets["val"])
    return {
        "rate": images / (clock["end"] - clock["start"]),
        "map": metrics["val/mAP50-95"],
        "images": images,
    }


def run_oracle(args: argparse.Namespace) -> dict[str, Any]:
    from ultralytics.models.yolo.detect import DetectionValidator

    torch.set_num_threads(args.threads)
    model = torch.load(args.ref_weights, weights_only=False)["model"].float()
    device = "0" if torch.cuda.is_available() else "cpu"
    validator = DetectionValidator(
        args={
            "data": args.yaml, "imgsz": args.image_size, "batch": args.batch, "plots": False, "conf": 0.001,
            "iou": 0.7, "max_det": 300, "workers": 0, "device": device, "half": False, "save_json": False,
            "rect": args.rect_batches,
            "project": args.workdir, "name": "oracle_val", "exist_ok": True,
        }
    )  # fmt: skip
    clock: dict[str, float] = {}

    def on_start(v: Any) -> None:
        torch.set_num_threads(args.threads)  # the oracle's select_device set cores - 1
        clock["start"] = time.perf_counter()

    validator.add_callback("on_val_start", on_start)
    validator.add_callback("on_val_end", lambda v: clock.setdefault("end", time.perf_counter()))
    stats = validator(model=model)
    images = len(validator.dataloader.dataset)
    return {
        "rate": images / (clock["end"] - clock["start"]),
        "map": stats["metrics/mAP50-95(B)"],
        "images": images,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", default="n")
    parser.add_argument("--image-size", type=int, default=320)
    parser.add_argument("--images", type=int, default=64, help="validation images")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--candidates", type=int, default=3000, help="(anchor, class) pairs per image above 0.001"
    )
    parser.add_argument("--switches", action="store_true", help="add ours with channels_last=False")
    parser.add_argument("--rect", action="store_true", help="add both sides with rectangular batches")
    parser.add_argument("--non-square", action="store_true", help="images of several aspect ratios")
    parser.add_argument("--rect-batches", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=("ours", "oracle"), help=argparse.SUPPRESS)
    parser.add_argument("--yaml", help=argparse.SUPPRESS)
    parser.add_argument("--weights", help=argparse.SUPPRESS)
    parser.add_argument("--ref-weights", help=argparse.SUPPRESS)
    parser.add_argument("--nchw", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        C.emit((run_ours if args.worker == "ours" else run_oracle)(args))
        return

    if not C.oracle_available():
        raise SystemExit("val_speed needs the oracle package (ultralytics) to build the shared weights")
    workdir = C.default_workdir()
    if args.non_square:
        from _non_square import ASPECTS, non_square_yaml

        yaml = non_square_yaml(
            workdir, train_per_aspect=2, val_per_aspect=max(args.images // len(ASPECTS), 1)
        )
    else:
        yaml = C.synthetic_yaml(workdir, num_train=8, num_val=args.images, image_size=args.image_size)
    ref_path, ours_path, bias = make_weights(workdir, args.scale, yaml, args.image_size, args.candidates)
    common = [
        "--scale", args.scale, "--image-size", str(args.image_size), "--batch", str(args.batch),
        "--threads", str(args.threads), "--yaml", str(yaml), "--weights", str(ours_path),
        "--ref-weights", str(ref_path), "--workdir", str(workdir / "val"),
    ]  # fmt: skip
    variants = [("ours", ["ours"]), ("oracle", ["oracle"])]
    if args.switches:
        variants.insert(1, ("ours NCHW", ["ours", "--nchw"]))
    if args.rect:
        variants += [("ours rect", ["ours", "--rect-batches"]), ("oracle rect", ["oracle", "--rect-batches"])]
    print(C.machine_info(args.threads), flush=True)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    for r in range(args.rounds):
        for name, worker in variants if r % 2 == 0 else variants[::-1]:
            out = C.run_worker(__file__, [*worker, *common], args.threads)
            results[name].append(out)
            print(f"  round {r + 1} {name}: {out['rate']:.2f} img/s, mAP50-95 {out['map']:.4f} "
                  f"(load {C.load_average()})", flush=True)  # fmt: skip
    oracle = [o["rate"] for o in results["oracle"]]
    rows = []
    for name, _ in variants:
        rates = [o["rate"] for o in results[name]]
        per_round = [a / b for a, b in zip(rates, oracle)]
        rows.append([name, C.median(rates), f"{C.median(per_round):.2f}", f"{C.spread(per_round):.0f}%",
                     f"{results[name][0]['map']:.4f}"])  # fmt: skip
    print(
        f"\nvalidation of {results['ours'][0]['images']} {'non-square' if args.non_square else 'square'} images, "
        f"yolo11{args.scale}, long side {args.image_size} (square batches: {args.image_size}x{args.image_size}), batch {args.batch}, {args.threads} threads, NMS conf 0.001 / IoU 0.7 / 300, "
        f"about {args.candidates} candidates per image (class bias {bias:.2f}); median of {args.rounds} alternating rounds\n"
    )
    print(C.format_table(["side", "img/s", "vs oracle", "± (half range)", "mAP50-95"], rows))
    print(f"\nload average at the end: {C.load_average()}")


if __name__ == "__main__":
    main()
