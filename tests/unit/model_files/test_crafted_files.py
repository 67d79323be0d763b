"""Crafted weights files, written opcode by opcode, through every public loader: each is refused with a clear
error, torch is unchanged afterwards and memory stays flat.

Run as a script (``python tests/unit/model_files/test_crafted_files.py OUT_DIR``, ``tests/helpers`` on PYTHONPATH) this file is also the runner: it imports the
loaders once, then forks one child per case under an address-space limit, so a bomb that got through would
fail its case with MemoryError instead of taking the machine down. Each child reports every loader's
outcome, whether ``torch.load`` still round-trips a tensor exactly, and its peak-RSS growth.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from pickle_ops import (
    BUILD,
    EMPTY_DICT,
    EMPTY_TUPLE,
    MARK,
    NEWOBJ,
    NONE,
    PROTO2,
    REDUCE,
    SETITEM,
    STOP,
    TUPLE,
    TUPLE1,
    TUPLE2,
    codec_bomb,
    copy_bomb,
    distinct_globals,
    get,
    glob,
    in_dict,
    integer,
    memo_chain,
    tensor_pickle,
    text,
    torch_zip,
)

RSS_LIMIT_MB = 256
_TIMEOUT_S = 240
HELPERS = Path(__file__).resolve().parents[2] / "helpers"  # pickle_ops, for the runner subprocess


def cases(marker: Path) -> dict[str, tuple[str, dict[str, bytes]]]:
    """name -> (regex the refusal must match, {form: file bytes})."""

    def both(pickle_bytes: bytes) -> dict[str, bytes]:
        return {"raw": pickle_bytes, "zip": torch_zip(pickle_bytes)}

    build_fn = glob("torch._utils", "_rebuild_tensor_v2")
    build_fn += NONE + EMPTY_DICT + text("__defaults__") + text("pwned") + TUPLE1 + SETITEM + TUPLE2 + BUILD
    build_cls = glob("torch.nn.modules.conv", "Conv2d")
    build_cls += NONE + EMPTY_DICT + text("forward") + text("x") + SETITEM + TUPLE2 + BUILD
    build_od = glob("collections", "OrderedDict")
    build_od += NONE + EMPTY_DICT + text("__repr__") + text("x") + SETITEM + TUPLE2 + BUILD
    build_od_safe = glob("collections", "OrderedDict")  # a class, and its state uses only allowed names
    build_od_safe += EMPTY_DICT + text("_metadata") + NONE + SETITEM + BUILD
    binbytes8 = in_dict(b"\x8e" + struct.pack("<Q", 2**40) + b"0123456789")
    bytearray8 = in_dict(b"\x96" + struct.pack("<Q", 2**33) + b"0123456789")
    return {
        "build_on_function": ("BUILD.*_rebuild_tensor_v2", both(in_dict(build_fn))),
        "build_on_stand_in_class": ("BUILD.*Conv2d|holds pickled model objects", both(in_dict(build_cls))),
        "build_on_ordereddict_class": ("BUILD.*OrderedDict", both(in_dict(build_od))),
        "build_on_ordereddict_class_metadata": ("BUILD.*OrderedDict", both(in_dict(build_od_safe))),
        "codec_bomb": (r"_codecs\.encode.*hex", both(codec_bomb())),
        "storage_claims_beyond_file": (
            "storage '0' claims 4398046511104 bytes",
            {"zip": torch_zip(tensor_pickle(2**40, (2**40,)), {"0": b"\0" * 16})},
        ),
        "tensor_view_beyond_storage": (
            "reaches past its storage",
            {"zip": torch_zip(tensor_pickle(4, (10**9,)), {"0": b"\0" * 16})},
        ),
        "compressed_entry_bomb": (
            "compressed",
            {"zip": torch_zip(in_dict(text("a")), {"0": 300 * 2**20}, deflate=True)},
        ),
        "binbytes8_claim": ("claims 1099511627776 bytes", both(binbytes8)),
        "bytearray8_claim": ("claims 8589934592 bytes", both(bytearray8)),
        "mark_depth_bomb": ("MARKs nested deeper", both(PROTO2 + MARK * 1_000_000 + STOP)),
        "tuple_depth_bomb": ("nests deeper", both(in_dict(EMPTY_TUPLE + TUPLE1 * 50_000))),
        "memo_list_depth_bomb": ("nests deeper", both(memo_chain())),
        "encode_copy_bomb": (  # _codecs.encode(<memoised 1 MB str>, "latin1") x 400
            "builds more than 64 MB of objects",
            both(
                copy_bomb(glob("_codecs", "encode"), text("x" * 2**20), get(2) + text("latin1") + TUPLE2, 400)
            ),
        ),
        "set_copy_bomb": (  # set(<memoised tuple of 100k ints>) x 1000
            "builds more than 64 MB of objects",
            both(
                copy_bomb(
                    glob("builtins", "set"),
                    MARK + b"".join(map(integer, range(10**5))) + TUPLE,
                    get(2) + TUPLE1,
                    1000,
                )
            ),
        ),
        "stand_in_args_bomb": (  # Conv2d(*<memoised tuple of 100k Nones>) x 1000
            "builds more than 64 MB of objects|holds pickled model objects",
            both(
                copy_bomb(glob("torch.nn.modules.conv", "Conv2d"), MARK + NONE * 10**5 + TUPLE, get(2), 1000)
            ),
        ),
        "distinct_globals_bomb": (
            "more than 2000 distinct globals|holds pickled model objects",
            both(distinct_globals()),
        ),
        "unknown_global_torch_load": (
            "refusing to load global 'torch.load'",
            both(in_dict(glob("torch", "load") + text("x.pt") + TUPLE1 + REDUCE)),
        ),
        "bytearray_allocation": (
            "refusing to load global 'builtins.bytearray'",
            both(in_dict(glob("builtins", "bytearray") + integer(2**33) + TUPLE1 + REDUCE)),
        ),
        "tensor_newobj_allocation": (
            "refusing to load global 'torch.Tensor'",
            both(in_dict(glob("torch", "Tensor") + integer(2**36) + TUPLE1 + NEWOBJ)),
        ),
        "os_system_marker": (
            "refusing to load global 'posix.system'",
            both(in_dict(glob("posix", "system") + text(f"touch {marker}") + TUPLE1 + REDUCE)),
        ),
    }


def npz_cases() -> dict[str, bytes]:
    """Label caches: an array header claiming 8 TB in 8 bytes, and 300 MB of zeros deflated to ~300 KB (as the
    entry read first, ``meta``)."""
    import numpy as np

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False, "shape": (10**12,)})
    claimed = io.BytesIO()
    with zipfile.ZipFile(claimed, "w") as z:
        z.writestr("meta.npy", header.getvalue() + b"\0" * 8)
    deflated = io.BytesIO()
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<i8", "fortran_order": False, "shape": (300 * 2**17,)}
    )
    with (
        zipfile.ZipFile(deflated, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z,
        z.open("meta.npy", "w", force_zip64=True) as f,  # 300 MB of zeros, deflated to ~300 KB
    ):
        f.write(header.getvalue())
        for _ in range(300):
            f.write(bytes(2**20))
    return {"npz_claimed_shape": claimed.getvalue(), "npz_deflated_bomb": deflated.getvalue()}


# -- the runner (a fresh interpreter: python tests/unit/model_files/test_crafted_files.py OUT_DIR) -------------------------
def _loaders():
    """name -> callable(path): every public way a user's file gets loaded."""
    from yolo11_lightning import YOLO11Module
    from yolo11_lightning.model_files.weights import load_model
    from yolo11_lightning.training.checkpointing import AtomicCheckpointIO
    from yolo11_lightning.training.run_identity import CheckpointSummary

    return {
        "load_model": load_model,
        "load_model(task='detect')": lambda p: load_model(p, task="detect"),
        "--model.weights": lambda p: YOLO11Module(scale="n", num_classes=3, weights=str(p)),
        "AtomicCheckpointIO.load_checkpoint": lambda p: AtomicCheckpointIO().load_checkpoint(p),
        "YOLO11Module.load_from_checkpoint": lambda p: YOLO11Module.load_from_checkpoint(p),
        "--ckpt_path (resume checks)": CheckpointSummary.read,
    }


def _round_trips(torch) -> bool:
    """torch.load (both loaders) returns exactly what torch.save wrote."""
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4) - 5.5
    buf = io.BytesIO()
    torch.save({"x": x}, buf)
    try:
        for weights_only in (True, False):
            buf.seek(0)
            if not torch.equal(torch.load(buf, weights_only=weights_only)["x"], x):
                return False
    except Exception:  # a modified torch may fail instead of returning wrong values
        return False
    return True


def _max_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _limit_address_space(extra_bytes: int) -> None:
    import resource

    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + extra_bytes, vm + extra_bytes))


def _load_cache_logged(path: Path) -> tuple[object, str]:
    """``load_cache(path)`` and what it logged."""
    import logging

    from yolo11_lightning.data.sources.cache import load_cache

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("yolo11_lightning.data.cache")
    logger.addHandler(handler)
    try:
        return load_cache(path, "key"), " ".join(seen)
    finally:
        logger.removeHandler(handler)


def _run_case(name: str, files: dict[str, Path], loaders: dict, marker: Path) -> dict:
    import torch

    defaults = torch._utils._rebuild_tensor_v2.__defaults__
    start, started = _max_rss_mb(), time.perf_counter()
    outcomes = {}
    for form, path in files.items():
        calls = {"label_cache": None} if name.startswith("npz") else loaders
        for loader, call in calls.items():
            try:
                if call is None:
                    result, logged = _load_cache_logged(path)
                    error = ("None", logged) if result is None else ("loaded", "")
                else:
                    call(path)
                    error = ("loaded", "")
            except BaseException as e:  # MemoryError included: that is a failure to report
                error = (type(e).__name__, str(e)[:600])
            outcomes[f"{form}/{loader}"] = {
                "error": error[0],
                "message": error[1],
                "round_trip": _round_trips(torch),
                "defaults_kept": torch._utils._rebuild_tensor_v2.__defaults__ == defaults,
            }
    seconds = time.perf_counter() - started
    return {
        "outcomes": outcomes,
        "rss_growth_mb": _max_rss_mb() - start,
        "marker": marker.exists(),
        "s": seconds,
    }


def main(out_dir: str) -> None:
    out = Path(out_dir)
    marker = out / "MARKER"
    all_cases = {name: files for name, (_, files) in cases(marker).items()}
    all_cases.update({name: {"npz": data} for name, data in npz_cases().items()})
    loaders = _loaders()
    results = {}
    for name, forms in all_cases.items():
        files = {}
        for form, data in forms.items():
            files[form] = out / f"{name}.{form}.{'npz' if form == 'npz' else 'pt'}"
            files[form].write_bytes(data)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one case, under an address-space limit
            os.close(read_fd)
            try:
                _limit_address_space(1 << 30)
                report = json.dumps(_run_case(name, files, loaders, marker)).encode()
            except BaseException as e:
                report = json.dumps({"crashed": f"{type(e).__name__}: {e}"}).encode()
            with os.fdopen(write_fd, "wb") as w:
                w.write(report)
            os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as r:
            data = r.read()
        _, status = os.waitpid(pid, 0)
        results[name] = json.loads(data) if data else {"crashed": f"child exited with status {status}"}
    (out / "results.json").write_text(json.dumps(results, indent=1))


@pytest.fixture(scope="module")
def crafted_results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("crafted")
    helpers = os.pathsep.join(p for p in (str(HELPERS), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "YOLO_OFFLINE": "1", "PYTHONPATH": helpers}
    proc = subprocess.run(
        [sys.executable, __file__, str(out)], capture_output=True, text=True, timeout=_TIMEOUT_S, env=env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("case", sorted(cases(Path("MARKER"))))
def test_crafted_file_is_refused_by_every_loader(crafted_results: dict, case: str) -> None:
    import re

    pattern = cases(Path("MARKER"))[case][0]
    result = crafted_results[case]
    assert "crashed" not in result, result
    assert not result["marker"], "the file ran a shell command"
    assert result["rss_growth_mb"] < RSS_LIMIT_MB, f"peak RSS grew by {result['rss_growth_mb']:.0f} MB"
    assert len(result["outcomes"]) == len(_loaders()) * len(cases(Path("MARKER"))[case][1])
    for where, outcome in result["outcomes"].items():
        form = where.split("/")[0]
        assert outcome["round_trip"] and outcome["defaults_kept"], f"{where}: torch was modified"
        assert outcome["error"] in ("CheckpointError", "ModelObjectsError", "WeightsMismatchError"), (
            where,
            outcome,
        )
        assert f"{case}.{form}.pt" in outcome["message"], (where, outcome["message"])  # names the file
        assert re.search(pattern, outcome["message"]), (where, outcome["message"])


@pytest.mark.parametrize("case", ["npz_claimed_shape", "npz_deflated_bomb"])
def test_crafted_label_cache_is_ignored(crafted_results: dict, case: str) -> None:
    result = crafted_results[case]
    assert "crashed" not in result, result
    (outcome,) = result["outcomes"].values()
    assert outcome["error"] == "None" and "ignoring label cache" in outcome["message"], outcome
    assert ("claims an array" if case == "npz_claimed_shape" else "compressed") in outcome["message"]
    assert result["rss_growth_mb"] < RSS_LIMIT_MB, f"peak RSS grew by {result['rss_growth_mb']:.0f} MB"


def test_the_guard_reads_what_torch_writes(tmp_path: Path) -> None:
    """The other side: real files of every kind of data and tensor layout read back exactly, by our own
    reader and through the guard in front of torch's loader (so the checks do not refuse honest files)."""
    import collections

    import torch

    from yolo11_lightning.model_files import torch_file

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    data = {
        "views": [
            base,
            base.t(),
            base[1:, 2:],
            base[:, ::2],
            base[2],
        ],  # one shared storage, strides, offsets
        "dtypes": [base.half(), base.bfloat16(), base.long(), base > 3, torch.tensor(2.5), torch.zeros(0, 3)],
        "parameter": torch.nn.Parameter(torch.ones(2)),
        "containers": collections.OrderedDict(a=(1, 2.5, None, True), b={"x", "y"}, c=[-(2**40), 1e300]),
        "bytes": b"\x00\xffraw",
        "size": torch.Size([2, 3]),
        "device": torch.device("cpu"),
        "text": "ünïcode",
    }
    path = tmp_path / "plain.pt"
    torch.save(data, path)
    expected = torch.load(path, weights_only=True)
    for got in (torch_file.load_reference(path), torch_file.load(path)):
        assert got.keys() == expected.keys()
        for a, b in zip(got["views"] + got["dtypes"], expected["views"] + expected["dtypes"]):
            assert (
                a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)
            )
        assert torch.equal(got["parameter"], expected["parameter"])
        assert isinstance(got["parameter"], torch.nn.Parameter)
        assert {k: got[k] for k in ("containers", "bytes", "size", "device", "text")} == {
            k: expected[k] for k in ("containers", "bytes", "size", "device", "text")
        }


if __name__ == "__main__":
    main(sys.argv[1])
