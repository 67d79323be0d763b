"""Multi-node across a real (virtual) network link: two hosts in network namespaces (tests/helpers/netns.py).

``scripts/torchrun_node.sh`` runs on each host (1 gloo rank per node, node 0's address as MASTER_ADDR) on
``tests/helpers/scripts/tiny_fit.yaml``: training across the link matches the 1-rank run on one host; a node cut
off mid-epoch ends on both sides by itself, with errors that name the lost peer, and the run resumes once
the link is back; a MASTER_ADDR nobody answers fails within the store timeout naming address and port.
Timeouts are seconds here (minutes on a cluster); every wait is bounded, so a hang fails the test.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runs import (
    REPO,
    assert_same_training_state,
    cli_env,
    final_checkpoint,
    fit_args,
    load,
    records,
)
from netns import TwoHosts, netns_unavailable

UNAVAILABLE = netns_unavailable()
pytestmark = pytest.mark.skipif(
    UNAVAILABLE is not None, reason=f"two-host tests need namespaces: {UNAVAILABLE}"
)

SCRIPT = str(REPO / "scripts" / "torchrun_node.sh")
PORT = "29500"  # each pair of namespaces has its own network stack: no clash with the machine or other tests
COLLECTIVE_TIMEOUT = 15  # seconds (DDPStrategy timeout)
DEADLINE = 5  # HangWatchdog deadline, seconds
STORE_TIMEOUT, AGENT_GRACE = 10, 20
_tags = itertools.count()


@pytest.fixture
def hosts() -> Iterator[TwoHosts]:
    """node0 (198.18.0.1) and node1 (198.18.0.2), removed with whatever still runs in them, pass or fail."""
    pair = TwoHosts(tag=f"yl{os.getpid() % 10000}t{next(_tags)}").create()
    try:
        yield pair
    finally:
        pair.remove()


def node_env(rank: int, master: str = "198.18.0.1", **extra: str) -> dict[str, str]:
    return cli_env(
        NNODES="2", NODE_RANK=str(rank), GPUS_PER_NODE="1", MASTER_ADDR=master, MASTER_PORT=PORT, RUN_ID="netns",
        MAX_RESTARTS="0", PYTHON=sys.executable, RDZV_TIMEOUT="60", STORE_TIMEOUT=str(STORE_TIMEOUT),
        AGENT_GRACE=str(AGENT_GRACE), **extra,
    )  # fmt: skip


def strategy(timeout: int = COLLECTIVE_TIMEOUT) -> list[str]:
    return ["--trainer.strategy", "lightning.pytorch.strategies.DDPStrategy",
            "--trainer.strategy.timeout", f"0:00:{timeout:02d}"]  # fmt: skip


def start_nodes(pair: TwoHosts, root: Path, args: list[str], log: str) -> list[subprocess.Popen]:
    """scripts/torchrun_node.sh on both hosts; output in ``root/<log>-node<N>.txt``."""
    return [
        host.popen(["bash", SCRIPT, *args[1:]], cwd=root, env=node_env(rank), text=True,
                   stdout=(root / f"{log}-node{rank}.txt").open("w"), stderr=subprocess.STDOUT)
        for rank, host in enumerate(pair.hosts)
    ]  # fmt: skip


def wait_all(nodes: list[subprocess.Popen], timeout: float) -> list[int]:
    """Exit codes; SIGKILL and fail when a node is still running ``timeout`` seconds from now."""
    deadline = time.monotonic() + timeout
    try:
        return [node.wait(timeout=max(deadline - time.monotonic(), 0.1)) for node in nodes]
    finally:
        for node in nodes:
            node.kill()


def logs(root: Path, log: str) -> list[str]:
    return [(root / f"{log}-node{rank}.txt").read_text() for rank in (0, 1)]


def test_two_hosts_have_own_names_addresses_and_a_link(hosts: TwoHosts) -> None:
    node0, node1 = hosts.hosts
    probe = "import socket; n = socket.gethostname(); print(n, socket.gethostbyname(n))"
    assert node0.run([sys.executable, "-c", probe]).stdout.split() == ["node0", "198.18.0.1"]
    assert node1.run([sys.executable, "-c", probe]).stdout.split() == ["node1", "198.18.0.2"]
    # node1 reaches a server on node0 by name across the link
    server = node0.popen([sys.executable, "-c", "import socket; s = socket.create_server(('198.18.0.1', 7000)); "
                          "c, a = s.accept(); c.sendall(a[0].encode())"], stdout=subprocess.PIPE)  # fmt: skip
    client = "import socket, time; time.sleep(1); print(socket.create_connection(('node0', 7000), 10).recv(64).decode())"
    try:
        assert node1.run([sys.executable, "-c", client]).stdout.strip() == "198.18.0.2"
    finally:
        server.kill()
        server.wait(timeout=10)
    route = node1.run(["ip", "-o", "route", "get", "198.18.0.1"]).stdout
    assert f"dev {node1.ifname}" in route
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    hosts.remove()
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert node0.name in names and node0.name not in after and node1.name not in after
    assert not Path("/etc/netns", node0.name).exists()


def test_two_nodes_train_across_the_link_like_one_rank_on_one_host(
    hosts: TwoHosts, tiny_dataset: Path, uninterrupted: Path, tmp_path: Path
) -> None:
    """The tiny run on the two hosts ends in the uninterrupted 1-rank run's state (``tests/conftest.py``, the
    reference every resume test holds a 2-rank run to, within 1e-5 of scale)."""
    args = fit_args(tiny_dataset, tmp_path, "rec", *strategy(60))
    codes = wait_all(start_nodes(hosts, tmp_path, args, "fit"), timeout=240)
    out = logs(tmp_path, "fit")
    assert codes == [0, 0], "\n".join(o[-4000:] for o in out)
    for rank, host in enumerate(hosts.hosts):  # the script chose the veth link, not lo, and said so
        assert f"(node {rank}): network interface {host.ifname} " in out[rank], out[rank][:2000]
        assert f"GLOO_SOCKET_IFNAME={host.ifname}" in out[rank]
    assert "the interface holding MASTER_ADDR 198.18.0.1" in out[0] and "the route to MASTER_ADDR" in out[1]
    starts = [r for r in records(tmp_path / "rec") if r["event"] == "start"]
    assert sorted((s["rank"], s["world"], s["num_nodes"]) for s in starts) == [(0, 2, 2), (1, 2, 2)]
    expected, actual = load(final_checkpoint(uninterrupted)), load(final_checkpoint(tmp_path))
    assert (actual["global_step"], actual["epoch"]) == (4, 1)
    assert_same_training_state(expected, actual)


def test_node_cut_off_mid_epoch_ends_both_nodes_naming_the_peer_then_resumes(
    hosts: TwoHosts, tiny_dataset: Path, tmp_path: Path
) -> None:
    """node1's link goes down in epoch 0: node0's rank fails by the collective timeout naming rank 1 on
    node1; node1's rank names the unreachable store, ends, and the script ends torchrun, which is left
    blocked: nothing runs on either host afterwards. With the link up, `--ckpt_path last` finishes."""
    watchdog = ["--trainer.callbacks+=yolo11_lightning.training.callbacks.hang_watchdog.HangWatchdog",
                "--trainer.callbacks.deadline", str(DEADLINE)]  # fmt: skip
    slow = ["--trainer.callbacks+=fault_callbacks.SlowBatches", "--trainer.callbacks.seconds", "0.5"]
    args = fit_args(tiny_dataset, tmp_path, "rec", *strategy(), *watchdog, *slow)
    nodes = start_nodes(hosts, tmp_path, args, "cut")
    deadline = time.monotonic() + 180
    while not list(tmp_path.glob("lightning_logs/*/checkpoints/last*.ckpt")):  # step 1 done and saved
        assert time.monotonic() < deadline and all(n.poll() is None for n in nodes), logs(tmp_path, "cut")
        time.sleep(0.2)
    hosts.hosts[1].link(up=False)
    # Both nodes end by themselves: node0 by the collective timeout, node1 also within torchrun's grace.
    codes = wait_all(nodes, timeout=COLLECTIVE_TIMEOUT + STORE_TIMEOUT + AGENT_GRACE + 60)
    out = logs(tmp_path, "cut")
    assert all(code != 0 for code in codes), "\n".join(o[-4000:] for o in out)
    assert [h.pids() for h in hosts.hosts] == [[], []], "processes left behind"
    assert "Timed out waiting 15000ms" in out[0], out[0][-4000:]
    assert re.search(r"Not answering: rank 1 \(node1, pid \d+\)", out[0]), out[0][-4000:]
    assert re.search(
        r"rank 1 \(node1.*The job's store at 198\.18\.0\.1:\d+ \(rank 0's host\) did not answer", out[1]
    )
    assert "torchrun is blocked: its exited workers stayed unreaped" in out[1], out[1][-4000:]
    (hang_dir,) = tmp_path.glob("lightning_logs/version_0/hang")
    assert sorted(p.name for p in hang_dir.iterdir()) == ["rank0.txt", "rank1.txt"]
    lost_at = load(final_checkpoint(tmp_path))["global_step"]
    assert 1 <= lost_at < 4

    hosts.hosts[1].link(up=True)
    codes = wait_all(start_nodes(hosts, tmp_path, args, "resume"), timeout=240)
    out = logs(tmp_path, "resume")
    assert codes == [0, 0], "\n".join(o[-4000:] for o in out)
    assert re.search(r"--ckpt_path last: resuming from \S*last\S*\.ckpt", out[0]), out[0][-4000:]
    final = load(final_checkpoint(tmp_path))
    assert (final["global_step"], final["epoch"]) == (4, 1)  # 2 epochs of 2 optimiser steps
    restarts = [r for r in records(tmp_path / "rec") if r["event"] == "start" and r["global_step"] > 0]
    assert sorted(r["rank"] for r in restarts) == [0, 1] and {r["global_step"] for r in restarts} == {lost_at}


def test_unreachable_master_addr_fails_within_the_store_timeout_naming_it(
    hosts: TwoHosts, tiny_dataset: Path, tmp_path: Path
) -> None:
    """node1 alone, told MASTER_ADDR=198.18.0.99 (no such host on the link): torchrun fails naming it."""
    args = fit_args(tiny_dataset, tmp_path, "rec")
    proc = hosts.hosts[1].run(["bash", SCRIPT, *args[1:]], cwd=tmp_path, env=node_env(1, master="198.18.0.99"),
                              timeout=STORE_TIMEOUT + AGENT_GRACE + 60)  # fmt: skip
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert re.search(rf"to connect to (any network address of )?\(198\.18\.0\.99, {PORT}\)", text), text[
        -4000:
    ]
    assert "RendezvousConnectionError: The connection to the C10d store has failed" in text
    assert hosts.hosts[1].pids() == []
