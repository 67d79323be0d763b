"""The GPU path on a machine without a GPU: the real CLI on the emu device (``tests/helpers/emulated_gpu.py``).

The emu device keeps a GPU's rules where our CPU runs cannot see them: its process group serves emu tensors only
(a host tensor in a collective fails as under NCCL), mixing CPU and device tensors fails as on CUDA, and every
host sync is recorded where it happens. These runs are the CPU reproductions of the GPU defects (an NCCL run
crashing at the end of its first validation, barriers and host reads in every step), and they check the step
as the issue asks: no barrier, one small collective per micro-batch beside DDP's own, no host sync outside
the steps the loggers write.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from cli_runs import HELPERS, REPO, SCRIPTS, TINY_FIT, run, run_cli, tail

EMU = '{"class_path": "emulated_gpu.EmuAccelerator"}'
EMU_DDP = '{"class_path": "emulated_gpu.EmuDDPStrategy"}'
EMU_SINGLE = (
    '{"class_path": "lightning.pytorch.strategies.SingleDeviceStrategy", "init_args": {"device": "emu:0"}}'
)
LOG_EVERY = 3
# The loss summary of detection ([Σ target scores, box, cls, dfl]) and the five rank flags (three stop
# signals: SIGTERM, SIGUSR1, Ctrl-C; a due save; substituted images): the one small all-reduce of a micro-batch.
EXCHANGED = 4 + 5


def _emu_env() -> dict[str, str]:
    # The package of this checkout, before any installed copy (the script runs outside the repository).
    return {"PYTHONPATH": f"{HELPERS}:{SCRIPTS}:{REPO}"}


def _fit(dataset: Path, root: Path, devices: int, strategy: str, *extra: str) -> subprocess.CompletedProcess:
    args = [
        "fit", "--config", str(TINY_FIT), "--data.dataset", str(dataset),
        "--trainer.default_root_dir", str(root), "--trainer.accelerator", EMU, "--trainer.strategy", strategy,
        "--trainer.devices", str(devices), "--trainer.log_every_n_steps", str(LOG_EVERY),
        # Saves at epoch ends only: the steps in between are the steady state.
        "--last_checkpoint.every_n_train_steps", "0", "--last_checkpoint.every_n_minutes", "0",
        "--trainer.callbacks+=emulated_audit.StepAudit", "--trainer.callbacks.out_dir", str(root / "audit"),
        *extra,
    ]  # fmt: skip
    return run_cli(args, cwd=root, timeout=400, **_emu_env())


@pytest.fixture(scope="module")
def two_ranks(
    tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("emu_two_ranks")
    return root, _fit(tiny_dataset, root, 2, EMU_DDP)


@pytest.fixture(scope="module")
def one_device(
    tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("emu_one_device")
    return root, _fit(tiny_dataset, root, 1, EMU_SINGLE)


def _audit(root: Path, rank: int = 0) -> list[dict]:
    return json.loads((root / "audit" / f"rank{rank}.json").read_text())["batches"]


def _steady(batches: list[dict]) -> list[dict]:
    """Batches after the first optimiser steps (their one-off work: the guard's counters reach the device,
    the EMA reads its count once, DDP rebuilds its buckets after its first step), leaving out each epoch's
    first batch (its window holds the previous epoch's end: validation, the epoch-end save)."""
    return [b for b in batches if b["global_step"] >= 3 and b["batch_idx"] > 0]


def _metrics(root: Path) -> list[dict]:
    import csv

    (path,) = root.glob("lightning_logs/version_*/metrics.csv")
    return list(csv.DictReader(path.open()))


# ------------------------------------------------------------------------------------------ NCCL-like DDP
def test_ddp_on_a_device_only_process_group_runs_through_validation(two_ranks) -> None:
    """The NCCL crash: mAP values computed on the host and logged with a sync reached a device-only group at
    the end of the first validation epoch ("No backend type associated with device type cpu")."""
    root, proc = two_ranks
    assert proc.returncode == 0, tail(proc)
    assert "No backend type associated" not in proc.stdout + proc.stderr
    logged = [float(r["val/mAP50-95"]) for r in _metrics(root) if r.get("val/mAP50-95")]
    assert len(logged) == 2 and all(0.0 <= v <= 1.0 for v in logged)  # one per epoch, finite
    assert all(b["device"] == "emu:0" for b in _audit(root, 0) + _audit(root, 1))


def test_ddp_step_has_no_barrier_and_one_small_collective_beside_ddps_own(two_ranks) -> None:
    root, proc = two_ranks
    assert proc.returncode == 0, tail(proc)
    for rank in (0, 1):
        steady = _steady(_audit(root, rank))
        assert len(steady) >= 3
        for batch in steady:
            ops = [(op, n, where) for op, n, where in batch["collectives"]]
            assert not [o for o in ops if o[0] == "barrier"], f"rank {rank}, batch {batch}: a barrier"
            ours = [o for o in ops if "yolo11_lightning" in o[2]]
            # One all-reduce per micro-batch: the loss normaliser and items, and the rank flags, together.
            assert [(o[0], o[1]) for o in ours] == [("allreduce", EXCHANGED)], ours
            assert "step_exchange.py" in ours[0][2]
            # Everything else is DDP's own: the gradient buckets (all-reduce, a stepping batch only) and,
            # with broadcast_buffers (DDP's default), rank 0's BatchNorm buffers before a window's forward.
            others = Counter(o[0] for o in ops if "yolo11_lightning" not in o[2])
            assert set(others) <= {"allreduce", "broadcast"}, others
            bucket_elements = sum(n for op, n, _ in ops if op == "allreduce" and "yolo11_lightning" not in _)
            assert bucket_elements in (0, 2_590_409), bucket_elements  # yolo11n's trainable parameters


def test_ddp_step_reads_nothing_back_to_the_host_outside_log_steps(two_ranks) -> None:
    root, proc = two_ranks
    assert proc.returncode == 0, tail(proc)
    for rank in (0, 1):
        for batch in _steady(_audit(root, rank)):
            sites = {where.split(":")[0] for _, where in batch["host_syncs"]}
            if batch[
                "logs"
            ]:  # the steps the loggers write (and epoch ends): the loss items read once, the LR monitor
                assert sites <= {
                    "yolo11_lightning/training/step_logging.py",
                    "lightning/pytorch/callbacks/lr_monitor.py",
                }
            else:
                assert not batch["host_syncs"], (
                    f"rank {rank} batch {batch['batch_idx']}: {batch['host_syncs']}"
                )


def test_single_device_step_reads_nothing_back_and_needs_no_collective(one_device) -> None:
    root, proc = one_device
    assert proc.returncode == 0, tail(proc)
    steady = _steady(_audit(root))
    assert steady and not any(b["collectives"] for b in _audit(root))
    for batch in steady:
        if not batch["logs"]:
            assert not batch["host_syncs"], batch
    assert any(b["logs"] for b in steady)  # the log steps are among them: the rule above was exercised


TASK_STEPS = ("pose", "obb", "classify")


@pytest.fixture(scope="module")
def task_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tests/helpers/scripts/emulated_task_steps.py``: 7 steps of each of ``TASK_STEPS`` on one emu device, audited."""
    root = tmp_path_factory.mktemp("emu_task_steps")
    script = SCRIPTS / "emulated_task_steps.py"
    proc = run([sys.executable, str(script), str(root), *TASK_STEPS], cwd=root, timeout=400, **_emu_env())
    assert proc.returncode == 0, tail(proc)
    return root


@pytest.mark.parametrize("task", TASK_STEPS)
def test_task_step_reads_nothing_back_to_the_host(task_steps: Path, task: str) -> None:
    """The detection tasks' step rule for pose, oriented boxes and classification (their batches, heads, losses):
    after the first three batches (the EMA's one-off read; the pictures of the first batches, drawn on the host
    by design), a step reads nothing back unless the loggers write after it (or it is the run's last step: the
    module logs there too, through ``training.step_logging``)."""
    batches = _audit(task_steps / task)
    assert all(b["device"] == "emu:0" for b in batches)
    steady = [b for b in batches if b["batch_idx"] >= 3]
    assert len([b for b in steady[:-1] if not b["logs"]]) >= 3, batches
    for batch in steady:
        if batch["logs"] or batch is batches[-1]:
            assert {where.split(":")[0] for _, where in batch["host_syncs"]} <= {
                "yolo11_lightning/training/step_logging.py",
            }
        else:
            assert not batch["host_syncs"], batch


def test_validate_on_one_device_under_ddp(one_device, tiny_dataset: Path, tmp_path: Path) -> None:
    """A one-GPU run with --trainer.strategy ddp crashed the same way: a process group of one."""
    root, proc = one_device
    assert proc.returncode == 0, tail(proc)
    (last,) = root.rglob("last.ckpt")
    args = ["validate", "--config", str(TINY_FIT), "--data.dataset", str(tiny_dataset), "--ckpt_path", str(last),
            "--trainer.default_root_dir", str(tmp_path), "--trainer.accelerator", EMU, "--trainer.strategy", EMU_DDP,
            "--trainer.devices", "1"]  # fmt: skip
    done = run_cli(args, cwd=tmp_path, timeout=300, **_emu_env())
    assert done.returncode == 0, tail(done)
    assert "val/mAP50-95" in done.stdout


# ------------------------------------------------------------------------------------------ the mechanism
# Registering the device is per process: the mechanism's checks run in one fresh interpreter, each section
# reporting on its own line.
MECHANISM = """
import traceback
import torch, emulated_gpu as emu


def rules():
    import torch, emulated_gpu as emu
    x = torch.ones(3, device="emu")
    try:
        x + torch.ones(3)  # a host tensor beside a device tensor
    except RuntimeError as e:
        assert "same device" in str(e), e
    else:
        raise SystemExit("mixed devices accepted")
    y = x * torch.tensor(2.0)  # a 0-dim host scalar is fine, as on CUDA
    with emu.sync_mode("error"):
        z = (y * 2).sum()
        for read in (lambda: z.item(), lambda: y.tolist(), lambda: y.cpu(), lambda: y[y > 1], lambda: bool(z)):
            try:
                read()
            except emu.HostSyncError:
                continue
            raise SystemExit("a host read went unnoticed")
        host = torch.empty(3)
        host.copy_(y, non_blocking=True)  # an asynchronous copy is not a sync


def loss():
    import torch, emulated_gpu as emu
    from yolo11_lightning.loss import DetectionLoss
    from yolo11_lightning.tasks.classify.loss import ClassificationLoss
    from yolo11_lightning.tasks.obb.loss import ObbLoss
    from yolo11_lightning.tasks.pose.loss import PoseLoss
    from yolo11_lightning.tasks.segment.loss import SegmentationLoss
    g = torch.Generator().manual_seed(0)
    nc, bs, counts = 3, 3, [2, 0, 3]
    feats = [torch.randn(bs, 64 + nc, s, s, generator=g, requires_grad=True) for s in (8, 4, 2)]
    rows = [[i, i % nc, 0.3 + 0.1 * i, 0.5, 0.2, 0.3] for i, n in enumerate(counts) for _ in range(n)]
    targets = torch.tensor(rows)
    targets[:, 2] += torch.rand(len(rows), generator=g) * 0.2
    coef = torch.randn(bs, 32, 84, generator=g, requires_grad=True)
    protos = torch.randn(bs, 32, 16, 16, generator=g, requires_grad=True)
    masks = torch.zeros(bs, 16, 16)
    masks[0, 2:8, 2:8], masks[0, 8:12, 8:12], masks[2, 1:15, 3:9] = 1, 2, 1
    # Pose (5 keypoints, one unlabelled), oriented boxes (the second box of image 0 under 2 px wide: left out
    # without a boolean mask), classification (one label per image).
    raw = torch.randn(bs, 15, 84, generator=g, requires_grad=True)
    keypoints = torch.rand(len(rows), 5, 3, generator=g)
    keypoints[:, 0, 2] = 0
    angles = torch.randn(bs, 1, 84, generator=g, requires_grad=True)
    rotated = torch.cat((targets, torch.rand(len(rows), 1, generator=g)), 1)
    rotated[1, 4] = 1.0 / 64
    logits = torch.randn(bs, nc, generator=g, requires_grad=True)
    labels = torch.tensor([0, 2, 1])
    dev = lambda t: t.detach().to("emu").requires_grad_(t.requires_grad)
    dfeats = [dev(f) for f in feats]
    for loss_fn, args, dargs in (
        (DetectionLoss(nc), (feats, targets), (dfeats, dev(targets))),
        (SegmentationLoss(nc), ((feats, coef, protos), targets, masks, counts),
         ((dfeats, dev(coef), dev(protos)), dev(targets), dev(masks), counts)),
        (PoseLoss(nc, (5, 3)), ((feats, raw), targets, keypoints),
         ((dfeats, dev(raw)), dev(targets), dev(keypoints))),
        (ObbLoss(nc), ((feats, angles), rotated), ((dfeats, dev(angles)), dev(rotated))),
        (ClassificationLoss(), (logits, labels), (dev(logits), dev(labels))),
    ):
        loss, items = loss_fn(*args)
        loss_fn.to("emu")  # its buffers (the pose sigmas), as the module's move does
        with emu.sync_mode("error"):
            dloss, ditems = loss_fn(*dargs)
            dloss.backward()
        torch.testing.assert_close(ditems.cpu(), items, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(dloss.cpu(), loss, rtol=1e-5, atol=1e-6)


for name, check in (("rules", rules), ("loss", loss)):
    try:
        check()
        print(name, "ok")
    except BaseException:
        print(name, "failed:", traceback.format_exc().replace(chr(10), " | "))
"""


@pytest.fixture(scope="module")
def mechanism() -> dict[str, str]:
    """Section -> "ok" or its failure, from one run of ``MECHANISM`` on the emu device."""
    proc = subprocess.run([sys.executable, "-c", MECHANISM], env={**_env(), "PYTHONPATH": str(HELPERS)},
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(
        line.split(" ", 1) for line in proc.stdout.splitlines() if line.split(" ", 1)[0] in ("rules", "loss")
    )


def test_the_emu_device_has_a_gpus_rules(mechanism: dict[str, str]) -> None:
    """What the reproductions rest on: mixed devices refused, every host read noticed, async copies not."""
    assert mechanism.get("rules") == "ok", mechanism


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_loss_makes_no_host_sync_on_a_device_and_equals_the_cpu_loss(mechanism: dict[str, str]) -> None:
    """The losses of every task on the emu device, forward and backward: no host read (the segmentation mask term
    sizes its per-image work from the batch's host-side counts; the OBB loss leaves its tiny boxes out through
    the assigner's ``gt_valid``), and the same values as on the CPU."""
    assert mechanism.get("loss") == "ok", mechanism


def test_exchange_on_one_process_moves_nothing_and_agrees_one_step_late() -> None:
    from yolo11_lightning.training.step_exchange import StepExchange

    exchange = StepExchange(("a", "b"))
    exchange.connect()  # no process group: one process
    summary = torch.tensor([1.0, 2.0])
    assert exchange.sum_over_ranks(summary) is summary
    exchange.set("a", 3)
    exchange.publish(torch.tensor([5.0]))
    assert exchange.agreed == {"a": 0.0, "b": 0.0}  # not before the next boundary
    assert exchange.advance() and exchange.agreed == {"a": 3.0, "b": 0.0} and exchange.extra == [5.0]
    assert not exchange.advance()  # nothing new published


def test_cuda_only_sync_tests_exist_for_the_device_run() -> None:
    """benchmarks/device/gpu.py runs tests/e2e/test_gpu_syncs.py on a lent GPU; here it must at least be collected."""
    import importlib.util

    # Beside this file; collected by this suite too: an import error fails it.
    spec = importlib.util.spec_from_file_location(
        "test_gpu_syncs", Path(__file__).with_name("test_gpu_syncs.py")
    )
    syncs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(syncs)
    tests = [name for name in dir(syncs) if name.startswith("test_")]
    assert {"test_single_gpu_step_makes_no_host_sync", "test_ddp_step_makes_no_host_sync"} <= set(tests)
    mark = syncs.pytestmark.mark  # skipped exactly where there is no GPU
    assert mark.name == "skipif" and bool(mark.args[0]) == (not torch.cuda.is_available())
