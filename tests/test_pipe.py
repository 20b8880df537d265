"""The pipelined round connection (queasy_py/store/pipe.py) against a real server: replies
reach their batch's callback in order; when a send fails, the batches already in flight get
their error callback (their replies are lost with the connection), so the supervisor keeps
their acks and releases their units instead of forgetting them."""

from __future__ import annotations

import socket
import time

import pytest
import redis

from queasy_py.store.pipe import RedisPipe


def test_replies_reach_their_batches_in_order(redis_url: str) -> None:
    pipe = RedisPipe(redis_url)
    got: list[list] = []
    try:
        pipe.send([("ECHO", "a"), ("ECHO", "b")], got.append, pytest.fail)
        pipe.send([("ECHO", "c")], got.append, pytest.fail)
        pipe.read(block=True)
        assert got == [[b"a", b"b"], [b"c"]]
    finally:
        pipe.close()


def test_a_failed_send_gives_the_batches_in_flight_their_error(redis_url: str) -> None:
    pipe = RedisPipe(redis_url)
    errors: list[BaseException] = []
    try:
        pipe.send([("PING",)], pytest.fail, errors.append)  # in flight: its reply unread
        sock = pipe.socket()
        assert sock is not None
        sock.shutdown(socket.SHUT_WR)  # the next send fails at once (EPIPE)
        with pytest.raises(redis.ConnectionError):
            pipe.send([("PING",)], pytest.fail, errors.append)
        assert len(errors) == 1 and isinstance(errors[0], redis.ConnectionError)  # the first
        assert not pipe.inflight
    finally:
        pipe.close()


def test_a_batch_with_no_reply_in_loop_redis_timeout_is_lost_with_its_connection(
    redis_url: str, prefix: str
) -> None:
    """A reply that never comes (here a BLPOP that blocks past the bound; on the network a
    connection dropped silently) must not hold the loop for ever: past LOOP_REDIS_TIMEOUT
    after the send, expire() fails the batch as a broken connection's (time is passed in,
    so the test does not wait for it)."""
    from queasy_py import defaults

    pipe = RedisPipe(redis_url)
    got: list = []
    errors: list[BaseException] = []
    try:
        pipe.send([("PING",)], got.extend, errors.append)
        pipe.read(block=True)
        assert len(got) == 1 and not errors
        sent = time.monotonic()
        pipe.send([("BLPOP", f"{prefix}:never", 30)], got.extend, errors.append)
        assert sent <= pipe.deadline() - defaults.LOOP_REDIS_TIMEOUT <= time.monotonic()
        pipe.expire(time.monotonic())  # within the bound: still waiting
        assert len(pipe.inflight) == 1 and not errors
        pipe.expire(pipe.deadline())
        assert not pipe.inflight and pipe.socket() is None
        assert len(errors) == 1 and isinstance(errors[0], redis.TimeoutError), errors
        assert pipe.deadline() == float("inf")
        # the next batch goes out on a new connection
        pipe.send([("PING",)], got.extend, errors.append)
        pipe.read(block=True)
        assert len(got) == 2 and len(errors) == 1
    finally:
        pipe.close()


def test_a_non_blocking_read_takes_what_arrived_whole_replies_and_errors_in_order(
    redis_url: str, prefix: str
) -> None:
    """The loop's read (not blocking) parses the socket itself (redis-py's can_read polled it
    twice and peeked at it per reply): a reply larger than one recv arrives whole over
    several reads, an error reply is its batch's ResponseError, a reply not yet there leaves
    its batch waiting without the read waiting for it, and redis-py's per-reply path is not
    taken on a plain connection."""
    from queasy_py.store import pipe as pipe_module

    pipe = RedisPipe(redis_url)
    got: list[list] = []
    big = "x" * (3 * pipe_module.RECV_SIZE + 7)
    try:
        pipe.send([("PING",)], got.append, pytest.fail)
        pipe.read(block=True)  # connected; from here redis-py's reading path is refused
        conn = pipe._conn

        def refused(*args: object, **kwargs: object) -> None:
            raise AssertionError("redis-py's per-reply path")

        conn.can_read = refused
        conn.read_response = refused
        pipe.send([("ECHO", big), ("HGET", f"{prefix}:s", "f")], got.append, pytest.fail)
        pipe.send(
            [("SET", f"{prefix}:s", "v"), ("HGET", f"{prefix}:s", "f")], got.append, pytest.fail
        )
        pipe.send([("BLPOP", f"{prefix}:later", 5)], got.append, pytest.fail)
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            pipe.read()
        assert got[0] == [b"PONG"]
        assert got[1] == [big.encode(), None]
        assert got[2][0] == b"OK" and isinstance(got[2][1], redis.ResponseError)
        assert "WRONGTYPE" in str(got[2][1])
        started = time.monotonic()
        pipe.read()  # the BLPOP's reply is not there: the read returns at once
        assert time.monotonic() - started < 1.0 and len(pipe.inflight) == 1
        redis.Redis.from_url(redis_url).rpush(f"{prefix}:later", "x")
        while len(got) < 4 and time.monotonic() < deadline:
            pipe.read()
        assert got[3] == [[f"{prefix}:later".encode(), b"x"]]
    finally:
        pipe.close()


def test_a_round_is_written_and_read_with_one_syscall_each_not_through_the_socket(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's socket has a timeout (LOOP_REDIS_TIMEOUT), and CPython polls such a socket
    before every send and recv: two syscalls for one, and a third with the poll the read made
    first. On a plain connection a round goes out with one write(2) and what arrived is read
    with one read(2): no method of the socket is called (the replies still come whole, in
    order, to their batches)."""
    import select

    pipe = RedisPipe(redis_url)
    got: list[list] = []
    try:
        pipe.send([("PING",)], got.append, pytest.fail)
        pipe.read(block=True)  # connected
        sock = pipe.socket()
        assert sock is not None and sock.gettimeout()  # a socket that polls first

        def refused(*args: object, **kwargs: object) -> None:
            raise AssertionError("a method of the socket: it polls before the syscall")

        for name in ("send", "sendall", "recv", "recv_into"):
            monkeypatch.setattr(socket.socket, name, refused)
        monkeypatch.setattr(select, "poll", refused)
        pipe.send([("ECHO", "a"), ("ECHO", "b")], got.append, pytest.fail)
        pipe.send([("ECHO", "c")], got.append, pytest.fail)
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            select.select([sock], [], [], 1.0)  # as the loop's selector: read when readable
            pipe.read()
        assert got == [[b"PONG"], [b"a", b"b"], [b"c"]]
    finally:
        monkeypatch.undo()
        pipe.close()


def test_a_round_larger_than_the_socket_takes_at_once_is_sent_whole(redis_url: str) -> None:
    """The one write(2) takes what the socket has room for; the rest goes out as redis-py
    sends (waiting for room, bounded by the timeout): a round of 16 MiB arrives whole."""
    pipe = RedisPipe(redis_url)
    got: list[list] = []
    big = "y" * (16 << 20)
    try:
        pipe.send([("PING",)], got.append, pytest.fail)
        pipe.read(block=True)
        pipe.send([("ECHO", big), ("ECHO", "after")], got.append, pytest.fail)
        pipe.read(block=True)
        assert got[1] == [big.encode(), b"after"]
    finally:
        pipe.close()
