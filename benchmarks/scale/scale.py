"""Start-up at scale: process start -> first training batch, cold (no label cache) and warm, and the peak memory
of the process tree, ours beside the reference trainer's, at 10k and 100k training images (1M with --million).

    python benchmarks/scale/scale.py                       # 10k and 100k; a few minutes per size
    python benchmarks/scale/scale.py --million             # and 1M (about 8 GB of files, generated once)
    python benchmarks/scale/scale.py --stages 10000 100000 1000000 --no-start   # the stage profile only
    python benchmarks/scale/scale.py --epoch-memory 100000 --no-start           # worker USS over one epoch

Data (``_scale_data``): tiny JPEGs (48x64 or 64x48) in folders of 10,000 with 1-3 boxes each, under
``--data`` (default: under $BENCH_DIR; point it at a disk with room for the 1M set). Both sides train yolo11n at 64 px, batch 16, 2 loader
workers, 1 CPU device, each run in its own fresh process, cold then warm, the sides alternating. Cold: both
label caches deleted first; warm: the cache the cold run wrote. Time: from the process's start (its
``create_time``) to the end of its first training batch. Memory: the largest sum of RSS over the process and
all its children (DataLoader workers, check processes), sampled every 50 ms by this script.

``--stages N ...``: our start taken apart in one process, stage by stage (listing, cache key, header reads,
label parsing and checks on one core, the whole parallel check, cache write and read, the Dataset, the ranks'
agreement hash, the sampler, the DataModule's setup cold and warm, the first batch), CPU seconds and wall.
``--label-side`` stops after the cache read (1M without writing a million image files is not possible here:
the check reads every image). ``--epoch-memory N``: the unique memory (USS, PSS) of each DataLoader worker
after its first batch and after the last batch of one epoch, loading only (no model).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import _scale_data

MIB = 1 << 20
SIDES = ("ours", "reference")


# ------------------------------------------------------------------------------------ workers
def _seconds_since_start() -> float:
    import psutil

    return time.time() - psutil.Process().create_time()


def _delete_caches(yaml: Path) -> None:
    """Both sides' label caches (``<labels folder>.cache`` and ``<labels folder>.<split>.cache.npz``)."""
    for pattern in ("*.cache", "*.cache.npz"):
        for path in (yaml.parent / "labels").rglob(pattern):
            path.unlink()


def start_worker(args: argparse.Namespace) -> dict:
    """One start of one side; stops after the first training batch."""
    import torch

    torch.set_num_threads(args.threads)
    stamps: dict[str, float] = {}
    if args.side == "ours":
        import lightning as L
        from _fit import our_fit_parts

        from yolo11_lightning.training.datamodule import YOLODataModule

        setup = YOLODataModule.setup

        def timed_setup(self, stage=None):
            t = time.perf_counter()
            setup(self, stage)
            stamps["setup_s"] = time.perf_counter() - t
            stamps["setup_end"] = _seconds_since_start()

        YOLODataModule.setup = timed_setup

        class FirstBatch(L.Callback):
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
                if "first_batch_s" not in stamps:
                    stamps["first_batch_s"] = _seconds_since_start()

        trainer, module, data = our_fit_parts(
            args.yaml, "n", 64, 16, 2, max_steps=1, workdir=args.workdir, callbacks=[FirstBatch()]
        )
        trainer.fit(module, datamodule=data)
    else:
        import ultralytics.data.dataset as oracle_dataset
        from _fit import oracle_trainer, train_oracle_until

        def timed(name: str, fn):
            def wrapper(*a, **k):
                t = time.perf_counter()
                out = fn(*a, **k)
                stamps[name] = stamps.get(name, 0.0) + time.perf_counter() - t
                return out

            return wrapper

        cls = oracle_dataset.YOLODataset
        cls.cache_labels = timed("check_s", cls.cache_labels)
        cls.get_labels = timed("labels_s", cls.get_labels)
        oracle_dataset.load_dataset_cache_file = timed("cache_read_s", oracle_dataset.load_dataset_cache_file)
        oracle_dataset.get_hash = timed("cache_key_s", oracle_dataset.get_hash)
        trainer = oracle_trainer(args.yaml, "n", 64, 16, 2, args.threads, args.workdir)

        def first(tr) -> bool:
            stamps.setdefault("first_batch_s", _seconds_since_start())
            return True

        train_oracle_until(trainer, first)
    return stamps


def _rss_tree(pid: int) -> int:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):  # ended meanwhile
            total += p.memory_info().rss
    return total


def run_start(args: argparse.Namespace, side: str, yaml: Path) -> dict:
    """One start of ``side`` in a fresh process: its stamps, and the peak summed RSS of its process tree."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        "PYTHONUNBUFFERED": "1",
        "PYTHONWARNINGS": "ignore",
    }
    workdir = C.default_workdir() / "scale_runs" / side
    workdir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, __file__, "--worker", "start", "--side", side, "--yaml", str(yaml),
               "--workdir", str(workdir), "--threads", str(args.threads)]  # fmt: skip
    out = Path(workdir) / "stdout.txt"
    with open(out, "w") as f:
        proc = subprocess.Popen(command, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=C.REPO)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _rss_tree(proc.pid))
            time.sleep(0.05)
    text = out.read_text()
    for line in reversed(text.splitlines()):
        if line.startswith(C.RESULT_TAG):
            return {**json.loads(line[len(C.RESULT_TAG) :]), "peak_rss_mib": peak / MIB}
    raise RuntimeError(f"{side} start failed (exit {proc.returncode}):\n{text[-4000:]}")


def stages_worker(args: argparse.Namespace) -> dict:
    """Our start stage by stage in this process (``--stages``)."""
    from yolo11_lightning.data.agreement import split_hash
    from yolo11_lightning.data.dataset import BoxDataset
    from yolo11_lightning.data.images.io import probe_image
    from yolo11_lightning.data.sampling.sampler import ElasticDistributedSampler
    from yolo11_lightning.data.sources import cache, split, yolo
    from yolo11_lightning.data.sources.config import load_dataset_config

    yaml = Path(args.yaml)
    _delete_caches(yaml)
    out: dict[str, list[float]] = {}

    def timed(name: str, fn):
        c0, t0 = time.process_time(), time.perf_counter()
        result = fn()
        out[name] = [time.perf_counter() - t0, time.process_time() - c0]
        print(f"{name}: {out[name][0]:.2f} s wall, {out[name][1]:.2f} s CPU", flush=True)
        return result

    config = load_dataset_config(yaml)
    entries = timed("listing", lambda: split._list_entries(config, "train"))
    images = [image for e in entries for image in e.images]
    key = timed("cache key (stat image + label)", lambda: split._cache_key(config, "train", entries))
    sample = images[:: max(1, len(images) // 100_000)]  # the one-core stages on at most 100k images
    scale = len(images) / len(sample)
    timed("header reads (1 core)", lambda: [probe_image(p) for p in sample])
    timed("header + labels (1 core)", lambda: yolo.check_images(sample, config.num_classes, None))
    for name in ("header reads (1 core)", "header + labels (1 core)"):
        out[name] = [v * scale for v in out[name]]
    out["label parsing + checks (1 core)"] = [
        a - b for a, b in zip(out["header + labels (1 core)"], out["header reads (1 core)"])
    ]
    del out["header + labels (1 core)"]
    children0 = os.times().children_user + os.times().children_system
    records, report, deps = timed(
        "whole check, parallel", lambda: split._parse(config, "train", entries, None, 178_956_970)
    )
    out["whole check, parallel"][1] += os.times().children_user + os.times().children_system - children0
    path = yaml.parent / "labels" / "stage_profile.npz"
    timed("cache write", lambda: cache.save_cache(path, key, records, report, deps))
    loaded, _ = timed("cache read", lambda: cache.load_cache(path, key))
    path.unlink()
    if not args.label_side:
        dataset = timed("Dataset", lambda: BoxDataset(loaded, 64, augment=True))
        timed("agreement hash", lambda: split_hash(dataset))

        def sampler() -> None:
            s = ElasticDistributedSampler(dataset, 16, num_replicas=1, rank=0, seed=0)
            next(iter(s))

        timed("sampler (first index)", sampler)
        from yolo11_lightning.training.datamodule import YOLODataModule

        def make() -> YOLODataModule:
            # Not persistent: the iterator, and its workers (which ignore SIGTERM), end after the first batch.
            return YOLODataModule(
                str(yaml),
                batch_size=16,
                image_size=64,
                num_workers=2,
                pin_memory=False,
                persistent_workers=False,
            )

        _delete_caches(yaml)
        timed("DataModule setup, cold", lambda: make().setup("fit"))
        data = make()
        timed("DataModule setup, warm", lambda: data.setup("fit"))
        timed("first batch (2 workers)", lambda: next(iter(data.train_dataloader())))
    return {"images": len(images), "stages": out}


def epoch_worker(args: argparse.Namespace) -> dict:
    """USS and PSS of each DataLoader worker after its first batch and after the epoch's last (``--epoch-memory``)."""
    import psutil

    from yolo11_lightning.training.datamodule import YOLODataModule

    data = YOLODataModule(
        args.yaml, batch_size=16, image_size=64, num_workers=2, pin_memory=False, persistent_workers=False
    )
    data.setup("fit")
    loader = data.train_dataloader()

    def workers() -> dict[int, tuple[float, float]]:
        out = {}
        for child in psutil.Process().children():
            try:
                rollup = Path(f"/proc/{child.pid}/smaps_rollup").read_text().splitlines()[1:]
            except OSError:
                continue
            f = {line.split(":")[0]: int(line.split()[1]) for line in rollup}
            out[child.pid] = ((f["Private_Clean"] + f["Private_Dirty"]) / 1024, f["Pss"] / 1024)
        return out

    start = end = None
    t0, batches = time.perf_counter(), 0
    for batches, _ in enumerate(loader, 1):
        if batches == 4:  # every worker has delivered a batch
            start = workers()
        end_candidate = batches == len(loader) - 2  # before the workers wind down
        if end_candidate:
            end = workers()
    return {"start": start, "end": end, "batches": batches, "seconds": time.perf_counter() - t0}


# ------------------------------------------------------------------------------------ tables
def growth(values: list[float], sizes: list[int]) -> str:
    """Growth factor per 10x images between the first and last size (log-log slope applied to 10x)."""
    import math

    if len(values) < 2 or values[0] <= 0 or values[-1] <= 0:
        return "-"
    per_decade = math.log10(values[-1] / values[0]) / math.log10(sizes[-1] / sizes[0])
    return f"{10**per_decade:.1f}x"


def main() -> None:
    ap = C.parser(__doc__, worker=("start", "stages", "epoch"), hidden=("--side", "--yaml", "--workdir"))
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--million", action="store_true", help="add 1,000,000 images to --sizes")
    ap.add_argument("--data", default=None, help="where the generated images go (default: under $BENCH_DIR)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each side")
    ap.add_argument("--rounds", type=int, default=1, help="cold + warm starts per side and size")
    ap.add_argument("--no-start", action="store_true", help="skip the start measurements")
    ap.add_argument("--no-oracle", action="store_true", help="our side only")
    ap.add_argument("--stages", type=int, nargs="*", default=[], help="stage profile at these sizes")
    ap.add_argument("--label-side", action="store_true", help="stages: stop after the cache read")
    ap.add_argument("--epoch-memory", type=int, default=0, help="worker USS over one epoch at this size")
    args = ap.parse_args()
    if C.run_as_worker(args, {"start": start_worker, "stages": stages_worker, "epoch": epoch_worker}):
        return
    root = Path(args.data) if args.data else C.default_workdir()
    C.print_machine_info(args.threads)
    sizes = args.sizes + ([1_000_000] if args.million else [])
    sides = ["ours"] if args.no_oracle or not C.oracle_available() else list(SIDES)
    if not args.no_start:
        results: dict[tuple[str, int], dict[str, list[float]]] = {}
        for size in sizes:
            yaml = _scale_data.scale_dataset(root, size)
            for r, side in C.rounds(sides, args.rounds * 1):
                for kind in ("cold", "warm"):
                    if kind == "cold":
                        _delete_caches(yaml)
                    res = run_start(args, side, yaml)
                    print(f"{size} {side} {kind} (round {r}): {json.dumps(res)}", flush=True)
                    got = results.setdefault((side, size), {})
                    got.setdefault(f"{kind}_s", []).append(res["first_batch_s"])
                    got.setdefault(f"{kind}_rss", []).append(res["peak_rss_mib"])
        rows = []
        for side in sides:
            row = [side]
            for metric in ("cold_s", "warm_s", "cold_rss", "warm_rss"):
                values = [C.median(results[(side, n)][metric]) for n in sizes]
                row += [*values, growth(values, sizes)]
            rows.append(row)
        headers = ["side"]
        for metric in ("cold s", "warm s", "cold peak MiB", "warm peak MiB"):
            headers += [f"{metric} {n // 1000}k" for n in sizes] + [f"{metric} per 10x"]
        C.print_table(
            f"Start to first batch and peak RSS of the process tree (load {C.load_average()})", headers, rows
        )
    for size in args.stages:
        yaml = _scale_data.scale_dataset(root, size)
        extra = ["--label-side"] if args.label_side else []
        res = C.run_worker(__file__, ["stages", "--yaml", str(yaml), *extra], args.threads, timeout=7200)
        rows = [[name, wall, cpu] for name, (wall, cpu) in res["stages"].items()]
        C.print_table(f"Stages at {res['images']} images (wall s, CPU s)", ["stage", "wall s", "CPU s"], rows)
    if args.epoch_memory:
        yaml = _scale_data.scale_dataset(root, args.epoch_memory)
        res = C.run_worker(__file__, ["epoch", "--yaml", str(yaml)], args.threads, timeout=7200)
        rows = [
            [pid, *res["start"].get(pid, ["-", "-"]), *res["end"].get(pid, ["-", "-"])]
            for pid in res["start"]
        ]
        C.print_table(
            f"DataLoader workers over one epoch at {args.epoch_memory} images ({res['batches']} batches, "
            f"{res['seconds']:.0f} s), MiB",
            ["worker pid", "USS start", "PSS start", "USS end", "PSS end"],
            rows,
        )


if __name__ == "__main__":
    main()
