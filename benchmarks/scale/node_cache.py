"""Image cache per node vs per rank: build time and memory (PSS) with 1 and 2 local ranks.

    python benchmarks/scale/node_cache.py                       # 256 synthetic PNGs at 640; about a minute
    python benchmarks/scale/node_cache.py --images 512 --ranks 1 2 4

Each setting starts R gloo processes on this host (one "node"); every rank builds the train split's cache
with ``node_cache.build_image_caches`` (shared: one segment in /dev/shm, each rank decoding 1/R of the
images; per rank: ``YOLO11_SHM_DIR`` pointed nowhere, so every rank decodes everything into its own
memory, the behaviour before the node cache). Build time is the slowest rank's; memory is the sum over the
ranks of the growth of their PSS (``/proc/self/smaps_rollup``) over the build, so a page shared by R
processes counts 1/R in each. Decoding threads per rank: cores / R (at most 8), as in training, or
``--threads`` (``--threads 1``: the decode work per rank, without the machine's core count in the way).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C

MIB = 1 << 20


def pss_bytes() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def run_rank(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from yolo11_lightning.data.dataset import BoxDataset
    from yolo11_lightning.data.images.node_cache import RankGroup, build_image_caches
    from yolo11_lightning.data.sources.config import load_dataset_config
    from yolo11_lightning.data.sources.split import load_split

    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    records = load_split(load_dataset_config(args.yaml), "train", verbose=False)[0]
    dataset = BoxDataset(records, args.size, augment=True)
    group = RankGroup(args.rank, args.world, args.rank, args.world, 0)
    dist.barrier()
    before, t0 = pss_bytes(), time.perf_counter()
    caches = build_image_caches([dataset], group, num_threads=args.threads)
    seconds = time.perf_counter() - t0
    dist.barrier()  # every rank has mapped and filled its pages before anyone measures
    grown = pss_bytes() - before
    dist.barrier()
    C.emit({"seconds": seconds, "pss": grown, "bytes": caches[0].image_bytes})
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(args: argparse.Namespace, yaml: Path, ranks: int, shared: bool) -> dict[str, float]:
    env = {
        **os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PYTHONWARNINGS": "ignore",
        "OMP_NUM_THREADS": "1", **({} if shared else {"YOLO11_SHM_DIR": "/nonexistent-shm"}),
    }  # fmt: skip
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                "--rank",
                str(r),
                "--world",
                str(ranks),
                "--yaml",
                str(yaml),
                "--size",
                str(args.size),
                *(["--threads", str(args.threads)] if args.threads else []),
            ],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(ranks)
    ]
    outs = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=900)
        line = next(x for x in reversed(stdout.splitlines()) if x.startswith(C.RESULT_TAG))
        outs.append(__import__("json").loads(line[len(C.RESULT_TAG) :]))
    return {
        "seconds": max(o["seconds"] for o in outs),
        "pss": sum(o["pss"] for o in outs),
        "bytes": outs[0]["bytes"],
    }


def main() -> None:
    parser = C.parser(__doc__, worker=True, hidden=("--yaml",))
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--size", type=int, default=640)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--threads", type=int, help="decoding threads per rank (default: cores / ranks, <= 8)"
    )
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if C.run_as_worker(args, run_rank):
        return
    yaml = C.synthetic_yaml(C.default_workdir(), num_train=args.images, num_val=8, image_size=args.size)
    from yolo11_lightning.data.sources.config import load_dataset_config
    from yolo11_lightning.data.sources.split import load_split

    load_split(load_dataset_config(yaml), "train", verbose=False)  # the label cache, before the ranks start
    C.print_machine_info()
    rows = []
    for ranks in args.ranks:
        for shared in (True, False):
            m = measure(args, yaml, ranks, shared)
            rows.append([
                ranks, "one per node" if shared else "one per rank", f"{m['seconds']:.2f}",
                f"{m['pss'] / MIB:.0f}", f"{m['pss'] / m['bytes']:.2f}",
            ])  # fmt: skip
            print(f"  {rows[-1]} (load {C.load_average()})", flush=True)
    caption = f"{args.images} images at long side {args.size} ({m['bytes'] / MIB:.0f} MiB decoded)"
    C.print_table(caption, ["ranks", "cache", "build s", "PSS MiB (all ranks)", "copies"], rows)


if __name__ == "__main__":
    main()
