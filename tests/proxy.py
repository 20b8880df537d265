"""A small TCP proxy in front of the test server that can hold back a reply: the command was
applied, its reply never comes (tests/test_lost_reply*.py)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis


def shut(*socks: socket.socket) -> None:
    """Shut both directions of each socket, whatever state it is in."""
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Proxy:
    """Forwards one port to the test server. With `on_reply` set, the next reply from the
    server is not forwarded: `on_reply()` runs, then the client's connection is closed."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.on_reply: Callable[[], None] | None = None
        self.closed = False
        self.clients: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.clients.append(client)
            self._forward(client, server)

    def _forward(self, client: socket.socket, server: socket.socket) -> None:
        """Start the two pumps of a new connection (client to server, server to client)."""
        threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
        threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while chunk := src.recv(65536):
                if replies and self.on_reply is not None:
                    action, self.on_reply = self.on_reply, None
                    action()
                    break
                dst.sendall(chunk)
        except OSError:
            pass
        shut(src, dst)
        for sock in (src, dst):
            sock.close()

    def drop_clients(self) -> None:
        """Close every client connection now, as a server restart would."""
        shut(*self.clients)

    def close(self) -> None:
        self.closed = True
        self.listener.close()


def through(proxy: Proxy, redis_url: str) -> str:
    """The test server's URL (its password too) with the proxy's address."""
    parts = urlsplit(redis_url)
    userinfo = parts.netloc.rpartition("@")[0]
    address = f"127.0.0.1:{proxy.port}"
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{address}" if userinfo else address))


def upstream(redis_url: str) -> tuple[str, int]:
    """The test server's address, for a proxy in front of it."""
    parsed = redis.connection.parse_url(redis_url)
    return parsed.get("host", "127.0.0.1"), int(parsed.get("port", 6379))


@pytest.fixture(name="proxy")
def proxy_fixture(redis_url: str) -> Iterator[Proxy]:
    """A proxy in front of the test server (import this into a test module)."""
    p = Proxy(upstream(redis_url))
    try:
        yield p
    finally:
        p.close()
