"""The loop's own read of the round pipe (store/pipe.py, `_read_now`: one poll, one recv,
every whole reply parsed by hiredis's reader) against a real server behind a relay that
hands the server's bytes on one at a time, or closes the connection part way through a
reply: each reply still reaches its batch whole and in order, and a connection closed
mid-reply gives the batches in flight their error (nothing is taken as a reply), after which
the next batch connects again."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import quote, unquote, urlsplit

import pytest
import redis

from queasy_py.store.pipe import RedisPipe


class Relay:
    """A TCP relay in front of the server: the client's bytes go on as they come; the
    server's go back one byte per send (`pace` apart), and after `close_after` of them the
    connection is closed (None: never)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.password = unquote(parts.password or "")
        if parts.scheme == "unix":
            self.upstream: tuple = (socket.AF_UNIX, parts.path)
        else:
            self.upstream = (socket.AF_INET, (parts.hostname, parts.port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.close_after: int | None = None
        self.pace = 0.0001  # seconds between two bytes: the reader meets partial replies
        self.accepted = 0
        self.sent = 0  # bytes of the server handed on, all connections
        self.stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://:{quote(self.password, safe='')}@127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self.stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            family, address = self.upstream
            server = socket.socket(family, socket.SOCK_STREAM)
            server.connect(address)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._up, args=(client, server), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        try:
            while chunk := client.recv(65536):
                server.sendall(chunk)
        except OSError:
            pass

    def _down(self, server: socket.socket, client: socket.socket) -> None:
        handed = 0
        try:
            while chunk := server.recv(65536):
                for i in range(len(chunk)):
                    if self.close_after is not None and handed >= self.close_after:
                        raise OSError("closed by the relay")
                    client.sendall(chunk[i : i + 1])
                    time.sleep(self.pace)
                    handed += 1
                    self.sent += 1
        except OSError:
            pass
        finally:
            for s in (client, server):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self.stop = True
        self.listener.close()


@pytest.fixture
def relay(redis_url: str) -> Iterator[Relay]:
    r = Relay(redis_url)
    yield r
    r.close()


def fast_only(pipe: RedisPipe) -> Callable[[], None]:
    """From here on, redis-py's per-reply reading path fails the test: the loop's own is read.
    Returns what undoes it (a new connection's handshake reads through redis-py)."""
    conn = pipe._conn

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("redis-py's per-reply path")

    conn.can_read = refused
    conn.read_response = refused

    def undo() -> None:
        del conn.can_read, conn.read_response

    return undo


def read_until(pipe: RedisPipe, done: object, seconds: float = 20.0) -> int:
    """Non-blocking reads (the loop's) until `done()`; returns how many reads it took."""
    deadline = time.monotonic() + seconds
    reads = 0
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, "replies did not arrive"
        pipe.read()
        reads += 1
        time.sleep(0.0005)
    return reads


def test_replies_split_at_every_byte_reach_their_batches_whole_and_in_order(
    relay: Relay, prefix: str
) -> None:
    pipe = RedisPipe(relay.url)
    got: list[list] = []
    try:
        pipe.send([("PING",)], got.append, pytest.fail)
        pipe.read(block=True)  # connected (AUTH went through the relay too)
        fast_only(pipe)
        key = f"{prefix}:h"
        pipe.send([("HSET", key, "f", "v" * 300), ("HGETALL", key)], got.append, pytest.fail)
        pipe.send([("HGET", key, "nope"), ("LPUSH", key, "x")], got.append, pytest.fail)
        pipe.send([("ECHO", "é\r\n" * 50)], got.append, pytest.fail)
        reads = read_until(pipe, lambda: len(got) == 4)
        assert got[0] == [b"PONG"]
        assert got[1] == [1, {b"f": b"v" * 300}] or got[1] == [1, [b"f", b"v" * 300]]
        assert got[2][0] is None and isinstance(got[2][1], redis.ResponseError), got[2]
        assert "WRONGTYPE" in str(got[2][1])
        assert got[3] == [("é\r\n" * 50).encode()]
        assert reads > 3, "the replies came in pieces (the relay hands on one byte per send)"
        assert not pipe.inflight
    finally:
        pipe.close()


def test_a_connection_closed_mid_reply_fails_the_batches_in_flight_then_reconnects(
    relay: Relay, prefix: str
) -> None:
    pipe = RedisPipe(relay.url)
    got: list[list] = []
    errors: list[BaseException] = []
    try:
        pipe.send([("PING",)], got.append, pytest.fail)
        pipe.read(block=True)
        undo = fast_only(pipe)
        relay.close_after = relay.sent + 1000  # part way through the next reply
        big = "y" * 5000
        pipe.send([("ECHO", big)], got.append, errors.append)
        pipe.send([("PING",)], got.append, errors.append)
        read_until(pipe, lambda: len(errors) == 2)
        assert got == [[b"PONG"]], "no piece of the cut reply is taken as a reply"
        assert all(isinstance(e, redis.ConnectionError) for e in errors), errors
        assert not pipe.inflight
        relay.close_after = None
        undo()
        pipe.send([("ECHO", big)], got.append, pytest.fail)  # a new connection
        read_until(pipe, lambda: len(got) == 2)
        assert got[1] == [big.encode()] and relay.accepted == 2
    finally:
        pipe.close()
