"""One Redis connection used without waiting for replies, for the scheduling loop.

Commands go out in batches (a round of acks and dequeues); replies are read when the socket
is readable, in order, and handed to the batch's callback. Several batches can be in flight,
so workers keep running while a round trip is under way.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import hiredis
import redis

from .. import defaults
from .connection import loop_client

log = logging.getLogger("queasy_py")

Reply = Any  # a decoded reply, or the redis.ResponseError it was


@dataclass(eq=False)
class Batch:
    size: int
    on_reply: Callable[[list[Reply]], None]
    on_error: Callable[[BaseException], None]
    replies: list[Reply] = field(default_factory=list)
    sent_at: float = 0.0  # time.monotonic() when it was sent


class RedisPipe:
    def __init__(self, url: str) -> None:
        self._client = loop_client(url)  # a send or a read waits LOOP_REDIS_TIMEOUT at most
        self._conn: Any = None
        self.inflight: deque[Batch] = deque()

    def socket(self) -> Any:
        """The socket to watch for replies, or None when not connected."""
        return getattr(self._conn, "_sock", None)

    def send(
        self,
        commands: Sequence[Sequence[Any]],
        on_reply: Callable[[list[Reply]], None],
        on_error: Callable[[BaseException], None],
    ) -> None:
        """Send `commands` now; `on_reply(replies)` runs once all their replies are read.

        Connection errors raise here (nothing of `commands` was queued; the batches already
        in flight get their `on_error`, as their replies are lost with the connection) or
        reach `on_error` later.
        """
        if self._conn is None:
            self._conn = self._client.connection_pool.get_connection()
        try:
            # hiredis packs str, bytes, int and float as they are (redis-py's packing adds
            # a Python pass over every argument: a tenth of the loop's time under load)
            packed = b"".join([hiredis.pack_command(tuple(c)) for c in commands])
            self._conn.send_packed_command([packed], check_health=False)
        except BaseException as exc:
            self.fail(exc)
            raise
        self.inflight.append(Batch(len(commands), on_reply, on_error, sent_at=time.monotonic()))

    def deadline(self) -> float:
        """When (time.monotonic()) the oldest batch in flight is past its wait for a reply
        (inf when none is in flight)."""
        if not self.inflight:
            return float("inf")
        return self.inflight[0].sent_at + defaults.LOOP_REDIS_TIMEOUT

    def expire(self, now: float) -> None:
        """A batch with no complete reply LOOP_REDIS_TIMEOUT after it was sent: its connection
        is taken as broken (a connection dropped silently on the way, with no reset, never
        answers and never errors: the loop would wait for it for ever), as in `fail`."""
        if now >= self.deadline():
            self.fail(redis.TimeoutError(f"no reply within {defaults.LOOP_REDIS_TIMEOUT:g} s"))

    def read(self, block: bool = False) -> None:
        """Read every reply that has arrived (with `block`, wait for all in flight)."""
        if not self.inflight:  # readable with nothing asked: the server closed it
            if self._conn is not None:
                self.reset()
            return
        try:
            while self.inflight:
                if not block and not self._conn.can_read(timeout=0):
                    return
                batch = self.inflight[0]
                try:
                    reply: Reply = self._conn.read_response()
                except redis.ResponseError as exc:
                    reply = exc
                batch.replies.append(reply)
                if len(batch.replies) == batch.size:
                    self.inflight.popleft()
                    batch.on_reply(batch.replies)
        except (redis.RedisError, OSError) as exc:  # lost, timed out, or a garbled stream
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        """The connection broke: every batch in flight gets `on_error`."""
        batches = list(self.inflight)
        self.reset()
        for batch in batches:
            batch.on_error(exc)

    def reset(self) -> None:
        self.inflight.clear()
        if self._conn is not None:
            self._conn.disconnect()
            self._client.connection_pool.release(self._conn)
            self._conn = None

    def close(self) -> None:
        self.reset()
        self._client.close()
