"""Dataset checking speed: per-image check cost, worker-process scaling, cold vs cached loads, vs the oracle.

    python benchmarks/speed/data_sources_speed.py [--images 300] [--size 480 640]

Builds a JPEG copy of the synthetic dataset (photo-sized, with labels) in a temp folder, then prints
side by side, measured in this one run:
  * per-image cost of ``probe_image`` (structure check + 1/8-scale decode) vs a full decode vs a
    header-only read (PIL, what the reference's check does; it cannot detect truncated data);
  * ``read_image`` (with its truncation check) vs plain ``cv2.imread`` + BGR->RGB;
  * ``load_split`` cold (no cache) in 1 process and with the default worker processes, and warm (cache hit);
  * the oracle's ``YOLODataset`` label caching, cold and warm, on the same files (if installed).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import cv2

from yolo11_lightning.data.images.io import probe_image, read_image
from yolo11_lightning.data.sources.config import load_dataset_config
from yolo11_lightning.data.sources.split import load_split
from yolo11_lightning.synthetic.shapes import make_synthetic_dataset


def _jpeg_dataset(root: Path, n: int, size: tuple[int, int]) -> Path:
    src = make_synthetic_dataset(root / "png", num_train=n, num_val=2, image_size=size, max_objects=8).parent
    for split in ("train", "val"):
        (root / "jpg" / "images" / split).mkdir(parents=True)
        shutil.copytree(src / "labels" / split, root / "jpg" / "labels" / split)
        for png in sorted((src / "images" / split).glob("*.png")):
            cv2.imwrite(str(root / "jpg" / "images" / split / f"{png.stem}.jpg"), cv2.imread(str(png)))
    shutil.copy(src / "data.yaml", root / "jpg" / "data.yaml")
    return root / "jpg" / "data.yaml"


def _per_image_ms(fn, paths: list[str], repeat: int = 2) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for p in paths:
            fn(p)
        best = min(best, time.perf_counter() - t)
    return best / len(paths) * 1e3


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _clear_caches(root: Path) -> None:
    for p in root.rglob("*.cache*"):
        p.unlink()


def main() -> None:
    parser = C.parser(__doc__)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--size", type=int, nargs=2, default=[480, 640], metavar=("H", "W"))
    args = parser.parse_args()
    C.print_machine_info()
    tmp = Path(tempfile.mkdtemp(prefix="bench_sources_"))
    try:
        yaml_path = _jpeg_dataset(tmp, args.images, tuple(args.size))
        config = load_dataset_config(yaml_path)
        paths = sorted(str(p) for p in (yaml_path.parent / "images" / "train").glob("*.jpg"))
        print(f"{len(paths)} JPEG images {args.size[1]}x{args.size[0]}, {os.cpu_count()} CPUs\n")

        rows = [("probe_image (check + 1/8 decode)", _per_image_ms(probe_image, paths))]
        rows.append(
            ("full decode cv2.imread", _per_image_ms(lambda p: cv2.imread(p, cv2.IMREAD_COLOR), paths))
        )
        try:
            from PIL import Image

            def pil_header(p: str) -> None:
                with Image.open(p) as im:
                    im.verify()
                    im.getexif()

            rows.append(("header only, PIL verify (no truncation check)", _per_image_ms(pil_header, paths)))
        except ImportError:
            pass
        rows.append(("read_image (RGB, truncation check)", _per_image_ms(read_image, paths)))
        rows.append(
            (
                "cv2.imread + cvtColor RGB",
                _per_image_ms(lambda p: cv2.cvtColor(cv2.imread(p), cv2.COLOR_BGR2RGB), paths),
            )
        )
        print(f"{'per image':<50} {'ms':>8}")
        for name, ms in rows:
            print(f"{name:<50} {ms:8.3f}")

        print(f"\n{'whole split (' + str(len(paths)) + ' images)':<50} {'s':>8} {'img/s':>9}")
        results = {}
        for name, kwargs in [
            ("load_split cold, 1 process", {"workers": 1}),
            ("load_split cold, default workers", {}),
        ]:
            _clear_caches(yaml_path.parent)
            results[name] = _timed(lambda kw=kwargs: load_split(config, "train", verbose=False, **kw))
        results["load_split warm (cache hit)"] = _timed(lambda: load_split(config, "train", verbose=False))
        try:
            os.environ.setdefault("YOLO_OFFLINE", "1")
            from ultralytics.data.dataset import YOLODataset

            data = {"names": dict(enumerate(config.names)), "nc": config.num_classes, "channels": 3}

            def oracle() -> None:
                YOLODataset(img_path=str(yaml_path.parent / "images" / "train"), data=data, task="detect")

            _clear_caches(yaml_path.parent)
            results["oracle YOLODataset cold"] = _timed(oracle)
            results["oracle YOLODataset warm"] = _timed(oracle)
        except ImportError:
            pass
        for name, seconds in results.items():
            print(f"{name:<50} {seconds:8.3f} {len(paths) / seconds:9.0f}")
        one, pool = results["load_split cold, 1 process"], results["load_split cold, default workers"]
        print(f"\nworker processes' speed-up on a cold load: {one / pool:.2f}x")
        if "oracle YOLODataset cold" in results:
            print(f"cold load vs oracle: {results['oracle YOLODataset cold'] / pool:.2f}x faster")
            print(
                f"warm load vs oracle: {results['oracle YOLODataset warm'] / results['load_split warm (cache hit)']:.2f}x faster"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
