"""The RAM image cache's memory check knows container limits (cgroup v2 and v1), read from fake files."""

from __future__ import annotations

from pathlib import Path

import pytest

from yolo11_lightning.data.images import cache as image_cache
from yolo11_lightning.data.images.cache import GIB, ImageCache, cgroup_memory_limits, memory_budget
from yolo11_lightning.structures.records import ImageRecord


def fake_v2(root: Path, path: str, limit: str, current: int, inactive: int = 0) -> Path:
    """A cgroup v2 mount at ``root`` with the process in ``path``; returns the /proc/self/cgroup file."""
    (root / "cgroup.controllers").parent.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "memory.max").write_text("max\n")  # the root cgroup has no limit file in reality: harmless
    (root / "memory.current").write_text("0\n")
    leaf = root / path.strip("/")
    leaf.mkdir(parents=True, exist_ok=True)
    (leaf / "memory.max").write_text(f"{limit}\n")
    (leaf / "memory.current").write_text(f"{current}\n")
    (leaf / "memory.stat").write_text(f"anon 1\ninactive_file {inactive}\nactive_file 2\n")
    proc = root.parent / "proc_self_cgroup"
    proc.write_text(f"0::{path}\n")
    return proc


def test_cgroup_v2_limit_and_usage_bound_the_available_memory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(image_cache, "available_memory_bytes", lambda: 64 * GIB)  # a big host
    root = tmp_path / "cgroup"
    proc = fake_v2(root, "/kubepods/pod1/ctr", str(2 * GIB), GIB + GIB // 2, inactive=GIB // 4)
    (limit,) = cgroup_memory_limits(str(root), str(proc))
    assert (limit.limit, limit.usage) == (2 * GIB, GIB + GIB // 4)  # inactive file cache is reclaimable
    available, where = memory_budget(str(root), str(proc))
    assert available == 3 * GIB // 4
    assert "container memory limit 2.00 GiB with 1.25 GiB in use" in where and "kubepods/pod1/ctr" in where
    # No limit ("max"): the host's figure stands.
    proc = fake_v2(root, "/kubepods/pod1/ctr", "max", GIB)
    assert memory_budget(str(root), str(proc)) == (64 * GIB, "host MemAvailable")


def test_cgroup_v1_limit_is_read_from_the_memory_controller(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(image_cache, "available_memory_bytes", lambda: 64 * GIB)
    root = tmp_path / "cgroup"
    memory = root / "memory"  # a container: its own cgroup mounted at the controller root
    memory.mkdir(parents=True)
    (memory / "memory.limit_in_bytes").write_text(f"{GIB}\n")
    (memory / "memory.usage_in_bytes").write_text(f"{GIB // 2}\n")
    (memory / "memory.stat").write_text(f"total_inactive_file {GIB // 4}\n")
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text("4:memory:/docker/0123abcd\n3:cpu,cpuacct:/docker/0123abcd\n0::/\n")
    assert memory_budget(str(root), str(proc))[0] == GIB - GIB // 4
    (memory / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert cgroup_memory_limits(str(root), str(proc)) == []


def test_cache_larger_than_the_container_limit_is_refused_with_the_figures_and_the_way_out(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(image_cache, "available_memory_bytes", lambda: 64 * GIB)
    root = tmp_path / "cgroup"
    proc = fake_v2(root, "/slurm/job_7", str(GIB), GIB // 2)
    monkeypatch.setattr(image_cache, "CGROUP_ROOT", str(root))
    monkeypatch.setattr(image_cache, "PROC_SELF_CGROUP", str(proc))
    records = [ImageRecord(f"/data/{i}.jpg", 480, 640) for i in range(1000)]  # 1000 x 640x480x3 = 0.86 GiB

    def never(i: int):
        raise AssertionError("nothing may be decoded before the check")

    with pytest.raises(MemoryError) as error:
        ImageCache.build(records, 640, never)
    message = str(error.value)
    for part in ("need an estimated 0.86 GiB", "0.50 GiB available", "container memory limit 1.00 GiB",
                 "0.50 GiB in use", "slurm/job_7", "--data.cache_images false", "--data.image_size"):  # fmt: skip
        assert part in message, message
    # Without the container limit the same cache fits.
    monkeypatch.setattr(image_cache, "PROC_SELF_CGROUP", str(tmp_path / "absent"))
    assert memory_budget()[0] == 64 * GIB
