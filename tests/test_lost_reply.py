"""A dispatch whose reply is lost after the server applied it is never sent again (it could
create a blocked copy of a job that already started: a job run twice); one that could not
have reached the server is. Real server, behind a small TCP proxy that can hold back a reply.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from lua_calls import live

from queasy_py import Client, ConnectionFailed


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


@pytest.fixture
def proxy(redis_url: str) -> Iterator[Proxy]:
    p = Proxy(upstream(redis_url))
    try:
        yield p
    finally:
        p.close()


def test_a_dispatch_whose_reply_is_lost_is_not_sent_again(
    proxy: Proxy, prefix: str, r: redis.Redis, redis_url: str
) -> None:
    with Client(through(proxy, redis_url), workers=0, prefix=prefix) as client:
        q = client.queue("q")
        q.dispatch({"warm": True}, id="warm")  # the connection is open and used
        # the server applies the dispatch; before its reply arrives a supervisor dequeues the
        # job (it starts), then the connection breaks
        proxy.on_reply = lambda: r.fcall(  # server clock, 2 jobs, expiry 10 s, no park
            "queasy_dequeue", 1, q.keys.base, "", "sup-1", "n1", 2, 10_000, 100, 0
        )
        with pytest.raises(ConnectionFailed, match="may have applied"):
            q.dispatch({"n": 1}, id="x")
        # nothing was sent again: no blocked copy of the running job
        assert live(q.counts()) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 2}
        info = q.get_job("x")
        assert info is not None and info.state == "active"


def test_a_connection_the_server_closed_is_replaced_before_sending(
    proxy: Proxy, prefix: str, r: redis.Redis, redis_url: str
) -> None:
    with Client(through(proxy, redis_url), workers=0, prefix=prefix) as client:
        q = client.queue("q")
        q.dispatch({}, id="a")
        proxy.drop_clients()
        q.dispatch({}, id="b")  # the closed connection is noticed and replaced: no error
        assert q.counts()["waiting"] == 2
