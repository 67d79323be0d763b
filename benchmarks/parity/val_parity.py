"""Validation parity: a reference-trained checkpoint scored by both validators and by both metrics.

    python benchmarks/parity/val_parity.py   # trains the checkpoint once (~10 min on 2 cores)
    python benchmarks/parity/val_parity.py --ours-repo /path/to/other/checkout   # "before": another revision of ours

A yolo11n trained by the reference trainer (random init, ``--epochs`` at 160 px) on synthetic shapes in
images of six sizes (five aspect ratios) (``non_square_yaml``), then validated at 160 px, conf 0.001, IoU 0.7, 300
per image, batch 16, by

- the reference validator (``YOLO(pt).val``: its defaults, Conv+BN fused), rect=True and rect=False;
- ours (``Trainer.validate``, defaults: channels-last), ``--data.rect_val`` true and false, and the same
  with ``--data.eval_box_gain per_axis`` (boxes mapped back per axis, where the reference uses one gain).

Each side's detections (in original pixels) are also scored by pycocotools against the same ground
truth; the reference prints its own AP (101-point interpolation of its own PR curve, matching in
letterboxed pixels), ours logs faster-coco-eval's COCO mAP and, with ``--model.reference_style_map true``,
the reference's figure computed by our code. ``pairs`` counts the reference's detections
with one of ours within 0.01 px and 1e-4 score (``tests/oracles/validation_oracle.match_detections``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
from _non_square import ASPECTS, non_square_yaml

# The parity tests' oracle and the data helpers it builds on.
sys.path[:0] = [str(C.REPO / "tests" / "oracles"), str(C.REPO / "tests" / "helpers")]


def train_reference(yaml: Path, workdir: Path, epochs: int) -> Path:
    """The reference trainer's last.pt (reused when already trained on this dataset)."""
    run = workdir / f"ref_train_{yaml.parent.name}_e{epochs}"
    weights = run / "weights" / "last.pt"
    if weights.is_file():
        return weights
    from ultralytics import YOLO

    YOLO("yolo11n.yaml").train(data=str(yaml), imgsz=160, epochs=epochs, batch=16, workers=0, device="cpu",
                               plots=False, val=False, project=str(workdir), name=run.name, exist_ok=True,
                               pretrained=False, seed=0, deterministic=True, amp=False, verbose=False)  # fmt: skip
    return weights


def ground_truth(yaml: Path) -> dict[str, Any]:
    """COCO ground truth (original pixels) of the val split."""
    import cv2

    root = yaml.parent
    images, annotations = [], []
    for path in sorted((root / "images" / "val").glob("*.png")):
        h, w = cv2.imread(str(path)).shape[:2]
        i = int(path.stem)
        images.append({"id": i, "height": h, "width": w, "file_name": path.name})
        for line in (root / "labels" / "val" / f"{path.stem}.txt").read_text().split("\n"):
            if line.strip():
                c, cx, cy, bw, bh = (float(v) for v in line.split())
                box = [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h]
                annotations.append({"id": len(annotations) + 1, "image_id": i, "category_id": int(c) + 1,
                                    "bbox": box, "area": box[2] * box[3], "iscrowd": 0})  # fmt: skip
    names = __import__("yaml").safe_load(yaml.read_text())["names"]
    names = names if isinstance(names, list) else [names[k] for k in sorted(names)]
    return {"images": images, "annotations": annotations,
            "categories": [{"id": k + 1, "name": n} for k, n in enumerate(names)]}  # fmt: skip


def run_oracle(args: argparse.Namespace) -> dict[str, Any]:
    from ultralytics import YOLO

    name = f"oracle_{'rect' if args.rect else 'square'}"
    metrics = YOLO(args.weights).val(data=args.yaml, imgsz=160, batch=16, rect=args.rect, save_json=True,
                                     plots=False, device="cpu", workers=0, project=args.workdir, name=name,
                                     exist_ok=True, verbose=False)  # fmt: skip
    detections = json.loads((Path(args.workdir) / name / "predictions.json").read_text())
    return {"printed": float(metrics.box.map), "detections": detections}


def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    if args.ours_repo:  # before _common's path entry (this checkout) is searched
        sys.path.insert(0, str(Path(args.ours_repo).resolve()))
    import lightning as L

    import yolo11_lightning
    from yolo11_lightning import YOLO11Module, YOLODataModule

    print("ours from", Path(yolo11_lightning.__file__).parent, file=sys.stderr)
    accepted = inspect.signature(YOLODataModule).parameters
    options = {"rect_val": args.rect} if "rect_val" in accepted else {}
    if args.per_axis:
        if "eval_box_gain" not in accepted:
            return {"printed": float("nan"), "detections": []}
        options["eval_box_gain"] = "per_axis"
    if args.rect and "rect_val" not in accepted:
        return {"printed": float("nan"), "detections": []}  # this revision has no rectangular validation
    data = YOLODataModule(dataset=args.yaml, batch_size=16, image_size=160, num_workers=0, **options)
    extra = (
        {"reference_style_map": True}
        if "reference_style_map" in inspect.signature(YOLO11Module).parameters
        else {}
    )
    module = YOLO11Module(scale="n", num_classes=data.num_classes, class_names=data.class_names,
                          weights=args.weights, log_images=0, **extra)  # fmt: skip
    out: list[dict[str, Any]] = []

    class Collect(L.Callback):
        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            for path, det in zip(batch["paths"], pl_module.val_map.to_original(outputs["detections"], batch)):
                for x1, y1, x2, y2, score, cls in det.tolist():
                    out.append({"image_id": int(Path(path).stem), "category_id": int(cls) + 1,
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "score": score})  # fmt: skip

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Collect()])  # fmt: skip
    metrics = trainer.validate(module, data, verbose=False)[0]
    reference_style = float(metrics.get("val/mAP50-95_reference_style", float("nan")))
    return {"printed": float(metrics["val/mAP50-95"]), "reference_style": reference_style, "detections": out}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--ours-repo", help="run our side from this checkout (e.g. the revision before a change)"
    )
    parser.add_argument("--worker", choices=("ours", "oracle"), help=argparse.SUPPRESS)
    parser.add_argument("--rect", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--per-axis", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--yaml", help=argparse.SUPPRESS)
    parser.add_argument("--weights", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = (run_ours if args.worker == "ours" else run_oracle)(args)
        Path(args.out).write_text(json.dumps(result))
        return

    import os
    import subprocess

    from validation_oracle import coco_map, match_detections

    workdir = C.default_workdir() / "val_parity"
    workdir.mkdir(parents=True, exist_ok=True)
    yaml = non_square_yaml(workdir)
    weights = train_reference(yaml, workdir, args.epochs)
    truth = ground_truth(yaml)
    print(C.machine_info(args.threads), flush=True)
    results: dict[tuple[str, bool], dict[str, Any]] = {}
    for side in ("oracle", "ours", "ours per_axis"):
        for rect in (True, False):
            out = workdir / f"{side.replace(' ', '_')}_{int(rect)}.json"
            env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
            command = [sys.executable, __file__, "--worker", side.split()[0], "--yaml", str(yaml),
                       "--weights", str(weights), "--workdir", str(workdir), "--out", str(out)]  # fmt: skip
            command += (["--rect"] if rect else []) + (["--per-axis"] if "per_axis" in side else [])
            if side != "oracle" and args.ours_repo:
                command += ["--ours-repo", args.ours_repo]
            subprocess.run(command, check=True, env=env, capture_output=True, timeout=1800)
            results[side, rect] = json.loads(out.read_text())
    rows = []
    for (side, rect), r in results.items():
        if not r["detections"]:
            rows.append([side, "rect" if rect else "square", "-", "-", "-", "-", "-"])
            continue
        reference = results["oracle", rect]["detections"]
        pairs = "-" if side == "oracle" else match_detections(reference, r["detections"])[3]
        style = r.get("reference_style", float("nan"))
        rows.append([side, "rect" if rect else "square", len(r["detections"]), pairs, f"{r['printed']:.4f}",
                     "-" if style != style else f"{style:.4f}", f"{coco_map(truth, r['detections']):.4f}"])  # fmt: skip
    print(f"\nyolo11n trained {args.epochs} epochs by the reference trainer at 160 px on {len(truth['images'])} val "
          f"images of {len(ASPECTS)} sizes; validation at 160 px, conf 0.001, IoU 0.7, max 300, batch 16"
          + (f"; ours from {args.ours_repo}" if args.ours_repo else "") + "\n")  # fmt: skip
    print(C.format_table(["validator", "batches", "detections", "pairs with the reference's",
                          "its own mAP50-95 (printed / logged)", "ours: mAP50-95_reference_style",
                          "pycocotools mAP50-95"], rows))  # fmt: skip


if __name__ == "__main__":
    main()
