"""The pipelined round connection (queasy_py/store/pipe.py) against a real server: replies
reach their batch's callback in order; when a send fails, the batches already in flight get
their error callback (their replies are lost with the connection), so the supervisor keeps
their acks and releases their units instead of forgetting them."""

from __future__ import annotations

import socket

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
