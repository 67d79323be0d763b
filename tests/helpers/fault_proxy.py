"""A fault-injecting HTTP proxy on 127.0.0.1 in front of a test's S3 server (``object_store.s3_server``).

Every request is forwarded to the server on a connection of its own (``Connection: close`` both ways, so each
request is seen), except the GETs of an object told to fail: the next ``times`` of them get an S3 error status
(``fail``), the headers and half the body then a closed connection (``drop``), or no answer at all / the
headers and half the body then nothing (``stall``: the connection stays open until the proxy stops), or the headers
then the body a byte at a time (``trickle``: never silent long enough for a read timeout). ``gets`` counts the GETs
of each object path (``/bucket/key``), faulted or not.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.parse
from collections import Counter
from collections.abc import Iterator

_ERRORS = {500: "InternalError", 502: "BadGateway", 503: "SlowDown", 504: "GatewayTimeout"}


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The head of an HTTP message (through the blank line) and what came after it; (b"", b"") at EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b"", b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _closing(head: bytes) -> bytes:
    """``head`` with ``Connection: close`` in place of any connection header."""
    lines = [
        line
        for line in head.split(b"\r\n")[:-2]
        if not line.lower().startswith((b"connection:", b"keep-alive:"))
    ]
    return b"\r\n".join([*lines, b"Connection: close", b"", b""])


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _pipe(source: socket.socket, target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := source.recv(65536):
            target.sendall(chunk)


class FaultProxy:
    """The proxy; ``endpoint`` is its url. Faults are given per object path ``/bucket/key``."""

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.gets: Counter[str] = Counter()
        self._faults: dict[str, list[tuple[str, int]]] = {}  # path -> [(kind, status)], one per GET to fault
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._open: set[socket.socket] = set()
        self.trickle_interval_s = 0.1
        threading.Thread(target=self._serve, daemon=True, name="fault-proxy").start()

    def fail(self, path: str, times: int, status: int = 503) -> None:
        """The next ``times`` GETs of ``path`` answer ``status`` with an S3 error body."""
        self._add(path, [("status", status)] * times)

    def drop(self, path: str, times: int) -> None:
        """The next ``times`` GETs of ``path`` get the headers and half the body, then a closed connection."""
        self._add(path, [("drop", 0)] * times)

    def stall(self, path: str, times: int, after_headers: bool = False) -> None:
        """The next ``times`` GETs of ``path`` get no answer, or (``after_headers``) the headers and half the
        body, then nothing more while the connection stays open."""
        self._add(path, [("stall-body" if after_headers else "stall", 0)] * times)

    def trickle(self, path: str, times: int, interval_s: float = 0.1) -> None:
        """The next ``times`` GETs of ``path`` get the headers, then one byte of the body every ``interval_s``."""
        self._add(path, [("trickle", 0)] * times)
        self.trickle_interval_s = interval_s

    def close(self) -> None:
        """Stop: stalled connections are closed, the port is freed."""
        self._stopped.set()
        self._listener.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _add(self, path: str, faults: list[tuple[str, int]]) -> None:
        with self._lock:
            self._faults.setdefault(path, []).extend(faults)

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        with self._lock:
            self._open.add(client)
        try:
            with client:
                head, rest = _read_head(client)
                if head:
                    self._answer(client, head, rest)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(client)

    def _answer(self, client: socket.socket, head: bytes, rest: bytes) -> None:
        method, target = head.split(b" ", 2)[:2]
        path = urllib.parse.unquote(target.decode().partition("?")[0])
        fault = None
        with self._lock:
            if method == b"GET":
                self.gets[path] += 1
                if self._faults.get(path):
                    fault = self._faults[path].pop(0)
        if fault is not None and fault[0] == "stall":
            self._stopped.wait()
            return
        if fault is not None and fault[0] == "status":
            code = _ERRORS.get(fault[1], "InternalError")
            body = f"<Error><Code>{code}</Code><Message>injected</Message><Resource>{path}</Resource></Error>"
            client.sendall(
                f"HTTP/1.1 {fault[1]} {code}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n{body}".encode()
            )
            return
        with socket.create_connection(self.upstream) as server:
            server.sendall(_closing(head) + rest)
            if _content_length(head) > len(rest) or b"chunked" in head.lower():  # a request body: pass it on
                threading.Thread(target=_pipe, args=(client, server), daemon=True).start()
            if fault is None:
                reply, body = _read_head(server)
                client.sendall(_closing(reply) + body)
                _pipe(server, client)
                return
            reply, body = _read_head(server)
            length = _content_length(reply)
            while len(body) < length and (chunk := server.recv(65536)):
                body += chunk
            if fault[0] == "trickle":
                client.sendall(_closing(reply))
                for i in range(len(body)):
                    if self._stopped.wait(self.trickle_interval_s):
                        return
                    client.sendall(body[i : i + 1])
                return
            client.sendall(_closing(reply) + body[: length // 2])
            if fault[0] == "stall-body":
                self._stopped.wait()


@contextlib.contextmanager
def fault_proxy(upstream: str) -> Iterator[FaultProxy]:
    """A ``FaultProxy`` in front of ``upstream`` (an ``http://host:port`` url), stopped on exit."""
    proxy = FaultProxy(upstream)
    try:
        yield proxy
    finally:
        proxy.close()
