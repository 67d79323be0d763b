"""Two test "hosts" in network namespaces joined by a veth pair, for the multi-node tests.

Each host is a namespace with its own interface, address (from the benchmarking range 198.18.0.0/15, never
routed anywhere else), loopback, routes and hostname: commands run through ``ip netns exec NAME unshare
--uts`` set the hostname ``node<N>``, and ``/etc/netns/NAME/hosts`` (which ``ip netns exec`` mounts over
``/etc/hosts``) resolves both hosts' names to their addresses, as a cluster's DNS would. Traffic only
crosses the veth link between the two addresses, or loopback inside a host. Needs root (``ip netns add``);
:func:`netns_unavailable` says why not when it is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "198.18.0"  # /24 inside 198.18.0.0/15; each pair of namespaces is its own isolated network
NETNS_ETC = Path("/etc/netns")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def netns_unavailable() -> str | None:
    """Why two-host tests cannot run here (missing tools, not root, namespaces refused), or None."""
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2 / util-linux)"
    if os.geteuid() != 0:
        return "network namespaces need root (`ip netns add`)"
    probe = f"ylprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "delete", probe, check=False)
    return None


@dataclass
class Host:
    """One namespace: ``name`` (the netns), ``hostname`` (``node<N>``), ``address`` and interface ``ifname``."""

    name: str
    hostname: str
    address: str
    ifname: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run inside this host, under its own hostname (a fresh UTS namespace)."""
        set_name = 'hostname "$0" && exec "$@"'
        return ["ip", "netns", "exec", self.name, "unshare", "--uts", "--", "sh", "-c", set_name,
                self.hostname, *argv]  # fmt: skip

    def run(self, argv: Sequence[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), capture_output=True, text=True, timeout=timeout, **kwargs)

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), **kwargs)

    def pids(self) -> list[int]:
        """Every process running inside this host's namespace."""
        out = _ip("netns", "pids", self.name, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_all(self, sig: int = signal.SIGKILL) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def link(self, up: bool) -> None:
        """Bring this host's end of the link up or down (down: a pulled cable, as the other host sees it)."""
        _ip("-n", self.name, "link", "set", self.ifname, "up" if up else "down")


@dataclass
class TwoHosts:
    """``node0`` and ``node1`` joined by a veth pair; :meth:`remove` kills what runs in them and deletes them."""

    tag: str = field(default_factory=lambda: f"yl{os.getpid() % 100000}")
    hosts: list[Host] = field(default_factory=list)

    def create(self) -> TwoHosts:
        names = [f"{self.tag}n{i}" for i in (0, 1)]
        self.hosts = [
            Host(n, f"node{i}", f"{SUBNET}.{i + 1}", f"{self.tag}v{i}") for i, n in enumerate(names)
        ]
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.hostname}\n" for h in self.hosts)
        try:
            for h in self.hosts:
                _ip("netns", "add", h.name)
                (NETNS_ETC / h.name).mkdir(parents=True, exist_ok=True)
                (NETNS_ETC / h.name / "hosts").write_text(hosts_file)
            a, b = self.hosts
            _ip(
                "link",
                "add",
                a.ifname,
                "netns",
                a.name,
                "type",
                "veth",
                "peer",
                "name",
                b.ifname,
                "netns",
                b.name,
            )
            for h in self.hosts:
                _ip("-n", h.name, "addr", "add", f"{h.address}/24", "dev", h.ifname)
                _ip("-n", h.name, "link", "set", h.ifname, "up")
                _ip("-n", h.name, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        """Kill every process inside, delete the namespaces (and with them the veth pair) and hosts files."""
        for h in self.hosts:
            h.kill_all()
        deadline = time.monotonic() + 10
        while any(h.pids() for h in self.hosts) and time.monotonic() < deadline:
            time.sleep(0.1)
        for h in self.hosts:
            _ip("netns", "delete", h.name, check=False)
            shutil.rmtree(NETNS_ETC / h.name, ignore_errors=True)
        if NETNS_ETC.is_dir() and not any(NETNS_ETC.iterdir()):
            NETNS_ETC.rmdir()

    def __enter__(self) -> TwoHosts:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.remove()
