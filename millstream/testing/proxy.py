"""A TCP proxy that can cut every connection: a broker outage without losing the broker's data.

Kafka clients connect to the address a broker advertises, so the broker must advertise the
proxy's port (see `start_kafka(advertised_port=...)`). `cut(seconds)` closes every open
connection at once and refuses new ones for `seconds`, which is what clients see when a broker
crashes and comes back; the broker's log, transactions and offsets are untouched. A `tap`
sees the bytes of each connection, both ways (e.g. `millstream.testing.txn_wire`).
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

Observer = Callable[[bytes], None]

HOST = "127.0.0.1"


def quiet_port(exclude: Collection[int] = ()) -> int:
    """A free loopback port below the kernel's ephemeral range, which `free_port()` (the ports
    of the embedded children: broker, moto) never hands out: a proxy can advertise it before it
    listens without a child taking it meanwhile."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        if port in exclude:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port below {low}")


class TcpProxy:
    """Forwards HOST:`listen_port` to HOST:`target_port`, one pair of threads per connection."""

    def __init__(
        self,
        listen_port: int,
        target_port: int,
        tap: Callable[[], tuple[Observer, Observer]] | None = None,
    ) -> None:
        """`tap`, called once per connection, returns observers of its (to target, to client)
        bytes; they run on the forwarding threads before the bytes are passed on."""
        self.listen_port = listen_port
        self._tap = tap
        self.target_port = target_port
        self.cuts = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._server: socket.socket | None = None
        self._closed = threading.Event()
        self._open_after = 0.0
        self._thread = threading.Thread(target=self._accept_loop, name="tcp-proxy", daemon=True)

    def start(self) -> TcpProxy:
        self._listen()
        self._thread.start()
        return self

    def cut(self, seconds: float) -> None:
        """Close every connection now and refuse new ones for `seconds`."""
        with self._lock:
            self._open_after = time.monotonic() + seconds
            server, self._server = self._server, None
            victims = list(self._sockets)
            self._sockets.clear()
            self.cuts += 1
        if server is not None:
            server.close()
        for sock in victims:
            _close(sock)

    def close(self) -> None:
        self._closed.set()
        self.cut(0)

    def _listen(self) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((HOST, self.listen_port))
        server.listen(128)
        server.settimeout(0.2)
        with self._lock:
            self._server = server

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                server = self._server
                reopen = server is None and time.monotonic() >= self._open_after
            if reopen:
                self._listen()
                continue
            if server is None:
                time.sleep(0.05)
                continue
            try:
                client, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            try:
                upstream = socket.create_connection((HOST, self.target_port), timeout=5)
            except OSError:
                _close(client)
                continue
            for sock in (client, upstream):
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets.update((client, upstream))
            observers: tuple[Observer | None, Observer | None] = (
                self._tap() if self._tap is not None else (None, None)
            )
            for src, dst, observe in (
                (client, upstream, observers[0]),
                (upstream, client, observers[1]),
            ):
                threading.Thread(target=self._pump, args=(src, dst, observe), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, observe: Observer | None) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if observe is not None:
                    try:
                        observe(data)
                    except Exception:  # a tap never breaks the forwarding
                        observe = None
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._sockets.discard(src)
                self._sockets.discard(dst)
            _close(src)
            _close(dst)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
