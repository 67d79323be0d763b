"""Training data from shards (issue 42): read speed per worker, start-up and memory at 1M samples, 100M on paper.

    python benchmarks/scale/object_storage.py                      # 384 JPEGs of 640x480, 1M-sample index; ~2 min
    python benchmarks/scale/object_storage.py --images 1024 --index-samples 100000
    python benchmarks/scale/object_storage.py --speed-only                          # part 1 only; ~30 s
    python benchmarks/scale/object_storage.py --faults-only                         # part 4 only; ~5 min

1. Images/s per worker (one process, one thread): each training image read, decoded (reduced JPEG decode) and
   resized to 640 (``BoxDataset.load_resized``, the part of a sample that depends on where the image lives), in the
   epoch's order, from: the folder (files in the page cache), the shards cold (an empty node cache, fetched from a
   local S3 server: moto on 127.0.0.1), the shards warm (the node cache filled). The folder's order is the global
   permutation; the shards' the shard-aware one (``--data.shard_window`` 16). The "bytes" rows read the image
   bytes only (no decode, the best epoch of 2 s of them); the last row reads small samples (64 px PNGs), where
   the reader's own cost per sample shows (the JPEGs' bytes are mostly a memory copy).
2. Start-up at ``--index-samples`` (a synthetic index: records of 1 box each in shards of 1,000 samples, uploaded to
   the server; no image is read): a fresh process reads the index and the train split's records
   (``open_index`` + ``load_shard_split``), from the server and from a local folder: seconds and RSS growth.
3. On paper: 100M images on 64 nodes of 8 GPUs (printed with the figures it uses).
4. ``--faults``: a failing store, with the default timeouts, attempts and rate floor. A fault proxy
   (``tests/helpers/fault_proxy.py``) between the reader and the server faults every GET of one shard (one image
   of 64 px) in one way; the table gives the GETs and seconds until that shard is named (or read, where the
   fault ends).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)
sys.path.insert(
    0, str(Path(__file__).resolve().parents[2] / "tests" / "helpers")
)  # object_store: the S3 server

import _common as C
import numpy as np

MIB = 1 << 20


def write_jpegs(root: Path, count: int) -> Path:
    """``count`` 640x480 JPEGs (about 60 KB: noise at 1/8 scale, upsampled) with one box each; the dataset yaml."""
    import cv2

    rng = np.random.default_rng(0)
    for split, n in (("train", count), ("val", 8)):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            small = rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)
            ok, data = cv2.imencode(".jpg", cv2.resize(small, (640, 480)), [cv2.IMWRITE_JPEG_QUALITY, 90])
            assert ok
            (root / "images" / split / f"{i:06d}.jpg").write_bytes(data.tobytes())
            (root / "labels" / split / f"{i:06d}.txt").write_text("0 0.5 0.5 0.25 0.25\n")
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: [thing]\n")
    return root / "data.yaml"


def images_per_s(load, order: np.ndarray) -> float:
    """How many of ``order`` ``load(index)`` gets through per second."""
    start = time.perf_counter()
    for index in order.tolist():
        load(index)
    return len(order) / (time.perf_counter() - start)


def best_rate(load, order: np.ndarray, seconds: float = 2.0) -> float:
    """The best ``images_per_s`` of epochs repeated for ``seconds`` (an epoch of bytes alone takes milliseconds:
    the best one is the figure a shared machine's other work disturbs least)."""
    rates, end = [], time.perf_counter() + seconds
    while len(rates) < 3 or time.perf_counter() < end:
        rates.append(images_per_s(load, order))
    return max(rates)


def read_speed(root: Path, url: str, count: int) -> dict[str, float]:
    from yolo11_lightning.data.dataset import BoxDataset
    from yolo11_lightning.data.sampling.sampler import epoch_order
    from yolo11_lightning.data.sampling.shard_windows import ShardWindows
    from yolo11_lightning.data.shards.reader import load_shard_split, open_index
    from yolo11_lightning.data.shards.writer import write_shards
    from yolo11_lightning.data.sources.split import dataset_config, load_split

    config = dataset_config(write_jpegs(root / "jpegs", count))
    write_shards(config, url, "detect", shard_mb=2)  # ~32 images a shard: several windows at this size
    folder_records, _ = load_split(config, "train")
    folder = BoxDataset(folder_records, 640, augment=True)
    for i in range(len(folder)):  # the files into the page cache
        Path(folder_records.path(i)).read_bytes()
    order = epoch_order(len(folder), 0, 0, 64)
    out = {
        "folder": images_per_s(folder.load_resized, order),
        "folder bytes": best_rate(lambda i: Path(folder_records.path(i)).read_bytes(), order),
    }
    for name in ("cold", "warm"):
        records, images = load_shard_split(open_index(url), "train", root / "node-cache")
        windows = ShardWindows(images.shard, 16)
        shards = BoxDataset(records, 640, augment=True, image_bytes=images, shard_windows=windows)
        order = epoch_order(len(shards), 0, 0, 64, windows)
        out[f"shards {name}"] = images_per_s(shards.load_resized, order)
    out["shards warm bytes"] = best_rate(lambda i: images.read(i, records.path(i)), order)
    out["bytes per image"] = float(np.mean(images.size))
    out["shards"] = float(len(images.shards))
    return out


def small_reads(root: Path) -> tuple[float, float]:
    """Reads/s of small samples (512 synthetic 64 px PNGs in shards of 256 KB, a local shard folder) from a warm
    node cache, bytes only: the reader's own cost per sample, which the JPEGs' copy hides; and their mean size."""
    from yolo11_lightning.data.sampling.sampler import epoch_order
    from yolo11_lightning.data.sampling.shard_windows import ShardWindows
    from yolo11_lightning.data.shards.reader import load_shard_split, open_index
    from yolo11_lightning.data.shards.writer import write_shards
    from yolo11_lightning.data.sources.split import dataset_config
    from yolo11_lightning.synthetic.shapes import make_synthetic_dataset

    made = make_synthetic_dataset(root / "small", num_train=512, num_val=2, image_size=64, seed=1)
    write_shards(dataset_config(made), str(root / "small-shards"), "detect", shard_mb=0.25)
    records, images = load_shard_split(open_index(str(root / "small-shards")), "train", root / "small-cache")
    order = epoch_order(len(records), 0, 0, 64, ShardWindows(images.shard, 16))
    members = [records.path(i) for i in range(len(records))]
    images_per_s(lambda i: images.read(i, members[i]), order)  # into the node cache
    return best_rate(lambda i: images.read(i, members[i]), order), float(np.mean(images.size))


def write_index(url: str, samples: int, per_shard: int = 1000) -> None:
    """A shard folder's index and records for ``samples`` samples of one box each (no tar is written)."""
    import fsspec

    from yolo11_lightning.data.shards import layout
    from yolo11_lightning.data.shards.writer import npz_bytes
    from yolo11_lightning.data.sources.packed_records import PackedRecords

    fs, root = fsspec.core.url_to_fs(url)
    n = samples
    names = np.char.add(np.char.zfill(np.arange(n).astype(str), layout.KEY_DIGITS), ".jpg").astype("S")
    arrays = dict(PackedRecords().arrays())
    arrays |= {
        "paths": np.frombuffer(b"".join(names.tolist()), np.uint8),
        "path_ends": np.cumsum(np.char.str_len(names), dtype=np.int64),
        "sizes": np.tile(np.array([[480, 640]], np.int64), (n, 1)),
        "label_ends": np.arange(1, n + 1, dtype=np.int64),
        "classes": np.zeros(n, np.int64),
        "boxes": np.tile(np.array([[0.5, 0.5, 0.25, 0.25]], np.float32), (n, 1)),
        "segment_sizes": np.zeros(n, np.int64),
        "keypoints": np.zeros((n, 0, 3), np.float32),
        "shard": np.arange(n, dtype=np.int64) // per_shard,
        "offset": 512 + (np.arange(n, dtype=np.int64) % per_shard) * 60_416,
        "size": np.full(n, 59_904, np.int64),
    }
    blob = npz_bytes(arrays)
    shards = -(-n // per_shard)
    shardlist = [
        {"url": layout.shard_file("train", k), "nsamples": min(per_shard, n - k * per_shard), "filesize": 0}
        for k in range(shards)
    ]
    import hashlib

    index = {
        "__kind__": layout.WIDS_KIND, "wids_version": 1, "name": "train", "shardlist": shardlist,
        layout.OUR_KEY: {"records": layout.records_file("train"), "records_sha256": hashlib.sha256(blob).hexdigest(),
                         "samples": n},
    }  # fmt: skip
    top = {"format": layout.FORMAT, "version": layout.VERSION, "task": "detect", "task_claim": None,
           "names": ["thing"], "label_options": {}, "splits": {"train": layout.split_index("train")}}  # fmt: skip
    fs.makedirs(root, exist_ok=True)
    fs.pipe_file(f"{root}/{layout.records_file('train')}", blob)
    fs.pipe_file(f"{root}/{layout.split_index('train')}", json.dumps(index).encode())
    fs.pipe_file(f"{root}/{layout.TOP_INDEX}", json.dumps(top).encode())


_STARTUP = r"""
import json, sys, time, psutil
from yolo11_lightning.data.shards.reader import load_shard_split, open_index
def memory():
    m = psutil.Process().memory_full_info()
    return m.rss, m.uss
rss0, uss0 = memory()
t = time.perf_counter()
records, images = load_shard_split(open_index(sys.argv[1]), "train", sys.argv[2])
seconds = time.perf_counter() - t
rss, uss = memory()
print(json.dumps({"seconds": seconds, "samples": len(records), "rss_mib": (rss - rss0) / 2**20,
                  "uss_mib": (uss - uss0) / 2**20}))
"""


def startup(url: str, cache: Path) -> dict:
    """One rank's start-up in a fresh process (``cache``: the node's cache folder)."""
    proc = subprocess.run(
        [sys.executable, "-c", _STARTUP, url, str(cache)], capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def paper(bytes_per_image: float, record_bytes: float) -> list[str]:
    """100M images on 64 nodes of 8 GPUs, from the measured image size and index bytes per sample."""
    images, nodes, gpus, shard_mb, window = 100e6, 64, 8, 256, 16
    per_shard = shard_mb * MIB / bytes_per_image
    shards = images / per_shard
    dataset_tb = images * bytes_per_image / 1e12
    index_gb = images * record_bytes / 1e9
    return [
        f"- images {images:.0e}, {bytes_per_image / 1e3:.0f} KB each (measured mean): {dataset_tb:.1f} TB",
        f"- shards of {shard_mb} MB: {per_shard:,.0f} images each, {shards:,.0f} shards",
        f"- index: the records file, {record_bytes:.0f} B per sample with one box (measured): {index_gb:.1f} GB,"
        f" fetched once per node ({nodes} GETs, {index_gb * nodes / 1e3:.2f} TB for the job) and mapped by the"
        f" node's {gpus} ranks from its cache folder",
        f"- per epoch, the shard-aware order (window {window} shards, ranks strided over each global batch): every"
        f" node reads every shard once per epoch while its window is in use: {dataset_tb:.1f} TB per node per epoch,"
        f" {dataset_tb * nodes:.0f} TB for the job; the node cache needs {window * shard_mb / 1024:.0f} GB (one window)"
        " plus the prefetched next one",
        f"- store requests: {shards:,.0f} shard GETs per node per epoch, {shards * nodes:,.0f} for the job"
        f" (an epoch of 100M images at 64 x 8 GPUs x 300 images/s = {images / (nodes * gpus * 300) / 60:.0f} min:"
        f" {shards * nodes / (images / (nodes * gpus * 300)):,.0f} GETs/s for the job, S3 serves 5,500 GETs/s per"
        " prefix)",
        f"- bandwidth: {dataset_tb * 1e12 / (images / (nodes * gpus * 300)) * 8 / 1e9:.1f} Gb/s into each node (the"
        f" whole set each epoch); with a node-partitioned order (each node its own 1/{nodes} of the shards, MosaicML's"
        f" canonical nodes) it would be {dataset_tb * 1e12 / nodes / (images / (nodes * gpus * 300)) * 8 / 1e9:.2f}"
        " Gb/s: the next step, not built",
    ]


FAULTS = (  # (row, FaultProxy method, its arguments after the path and count; None: every attempt)
    ("503 on every GET", "fail", {"status": 503}),
    ("500 on every GET", "fail", {"status": 500}),
    ("connection dropped mid-body", "drop", {}),
    ("headers and half the body, then silence", "stall", {"after_headers": True}),
    ("no answer at all", "stall", {}),
    ("a byte every 0.1 s (a trickle)", "trickle", {"interval_s": 0.1}),
)


def faults(root: Path, endpoint: str, bucket: str) -> list[tuple[str, int, float, str]]:
    """Each of ``FAULTS`` on every GET of one shard, then a stall on the first 3 GETs only: (row, GETs, seconds
    until the read ended, how it ended)."""
    import fsspec.config
    from fault_proxy import fault_proxy

    from yolo11_lightning.data.images.limits import ImageReadError
    from yolo11_lightning.data.shards import cache as cache_module
    from yolo11_lightning.data.shards.reader import load_shard_split, open_index
    from yolo11_lightning.data.shards.writer import write_shards
    from yolo11_lightning.data.sources.split import dataset_config
    from yolo11_lightning.synthetic.shapes import make_synthetic_dataset

    made = make_synthetic_dataset(
        root / "faulty", num_train=len(FAULTS) + 1, num_val=1, image_size=64, seed=2
    )
    url = f"s3://{bucket}/faulty"
    write_shards(dataset_config(made), url, "detect", shard_mb=0.005)  # one image per shard
    rows = []
    with fault_proxy(endpoint) as proxy:
        before = dict(fsspec.config.conf.get("s3", {}))
        fsspec.config.conf["s3"] = {**before, "endpoint_url": proxy.endpoint}
        try:
            records, images = load_shard_split(open_index(url), "train", root / "faulty-cache")
            cases = [(row, method, kw, cache_module.FETCH_ATTEMPTS) for row, method, kw in FAULTS]
            cases.append(("no answer 3 times, then served", "stall", {}, 3))
            for index, (row, method, kw, times) in enumerate(cases):
                path = f"/{bucket}/faulty/{images.shards[int(images.shard[index])]}"
                getattr(proxy, method)(path, times, **kw)
                start = time.monotonic()
                try:
                    images.read(index, records.path(index))
                    ended = "read"
                except ImageReadError as error:  # the shard named: why, in its own words
                    kind = re.search(r"cannot fetch the shard[^(]*\((\w+)", str(error))
                    ended = f"named ({kind[1] if kind else error})"
                rows.append((row, proxy.gets[path], time.monotonic() - start, ended))
                print(f"{row}: {rows[-1][1:]}", flush=True)
        finally:
            fsspec.config.conf["s3"] = before
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=384)
    p.add_argument("--index-samples", type=int, default=1_000_000)
    p.add_argument("--no-speed", action="store_true", help="skip the read speed (part 1)")
    p.add_argument("--speed-only", action="store_true", help="the read speed (part 1) only")
    p.add_argument("--faults-only", action="store_true", help="the failing store (part 4) only")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    C.print_machine_info(1)
    from object_store import s3_server

    bucket = "bench-shards"
    with tempfile.TemporaryDirectory() as tmp, s3_server(bucket) as endpoint:
        root = Path(tmp)
        if args.faults_only:
            print("\n## A failing store: one shard faulted on every GET, default timeouts, attempts, floor\n")
            print("| fault | GETs | seconds | ended |\n|---|---|---|---|")
            for row, gets, seconds, ended in faults(root, endpoint, bucket):
                print(f"| {row} | {gets} | {seconds:.1f} | {ended} |")
            return
        speed = {"bytes per image": 87e3}  # the default run's mean image size, for part 3
        if not args.no_speed:
            speed = read_speed(root, f"s3://{bucket}/jpegs", args.images)
            print(f"\n## Images/s per worker ({args.images} JPEGs 640x480, {speed['bytes per image'] / 1e3:.0f} KB"
                  f" each, {speed['shards']:.0f} shards of 2 MB; read + reduced decode + resize to 640)\n")  # fmt: skip
            print("| source | images/s |\n|---|---|")
            for name in ("folder", "shards warm", "shards cold", "folder bytes", "shards warm bytes"):
                print(f"| {name} | {speed[name]:.0f} |")
            rate, size = small_reads(root)
            print(f"| shards warm bytes, 64 px PNGs of {size / 1e3:.1f} KB | {rate:.0f} |")
        if args.speed_only:
            return
        print(
            f"\n## Start-up of one rank at {args.index_samples:,} samples (index + records, fresh process)\n"
        )
        print("| from | rank | seconds | RSS growth MiB | of it private (USS) MiB |\n|---|---|---|---|---|")
        write_index(f"s3://{bucket}/million", args.index_samples)
        write_index(str(root / "million"), args.index_samples)
        size = (root / "million" / "train.records.npz").stat().st_size
        for name, url in (
            ("local S3 server", f"s3://{bucket}/million"),
            ("local folder", str(root / "million")),
        ):
            node = root / f"node-{name.split()[-1]}"
            for rank in ("first of its node", "next"):
                s = startup(url, node)
                print(f"| {name} | {rank} | {s['seconds']:.2f} | {s['rss_mib']:.0f} | {s['uss_mib']:.0f} |")
        print(f"\nrecords file: {size / 1e6:.0f} MB")
        print("\n## 100M images on 64 nodes x 8 GPUs, on paper\n")
        print("\n".join(paper(speed["bytes per image"], size / args.index_samples)))


if __name__ == "__main__":
    main()
