"""TcpProxy on real sockets: forwards both ways, and a cut drops connections and refuses new ones."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from millstream.embedded import free_port
from millstream.testing.proxy import TcpProxy


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)


def test_forwards_then_cuts_then_accepts_again() -> None:
    server, port = _echo_server()
    proxy = TcpProxy(free_port(), port).start()
    try:
        client = socket.create_connection(("127.0.0.1", proxy.listen_port), timeout=5)
        client.sendall(b"ping")
        assert client.recv(4) == b"ping"
        proxy.cut(1.0)
        assert client.recv(4) == b""  # the open connection was closed under the client
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", proxy.listen_port), timeout=1).recv(1)
        time.sleep(1.5)
        again = socket.create_connection(("127.0.0.1", proxy.listen_port), timeout=5)
        again.sendall(b"back")
        assert again.recv(4) == b"back"
        assert proxy.cuts == 1
    finally:
        proxy.close()
        server.close()
