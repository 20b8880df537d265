"""One Redis connection used without waiting for replies, for the scheduling loop.

Commands go out in batches (a round of acks and dequeues); replies are read when the socket
is readable, in order, and handed to the batch's callback. Several batches can be in flight,
so workers keep running while a round trip is under way.
"""

from __future__ import annotations

import logging
import os
import socket
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

#: the most bytes one recv of the non-blocking read takes
RECV_SIZE = 1 << 17

Reply = Any  # a decoded reply, or the redis.ResponseError it was


@dataclass(eq=False)
class Batch:
    size: int
    on_reply: Callable[[list[Reply]], None]
    on_error: Callable[[BaseException], None]
    replies: list[Reply] = field(default_factory=list)
    sent_at: float = 0.0  # time.monotonic() when it was sent


class RedisPipe:
    _fast: tuple[Any, int, Any, Any, Any] | None = None  # see _fast_path()

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
            fast = self._fast_path()
            if fast is not None:
                # one write(2): a socket with a timeout polls before every send (CPython's
                # sock_call), a syscall per round for a socket that nearly always has room
                try:
                    sent = os.write(fast[1], packed)
                except BlockingIOError:  # no room now (a server not reading)
                    sent = 0
                except OSError as exc:  # as redis-py raises it (the connection is reset)
                    raise redis.ConnectionError(
                        f"Error {exc.errno} while writing to socket. {exc.strerror}."
                    ) from exc
                if sent < len(packed):  # the rest as redis-py sends, waiting for room
                    self._conn.send_packed_command([packed[sent:]], check_health=False)
            else:
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
        fast = None if block else self._fast_path()
        try:
            if fast is not None:
                self._read_now(*fast)
                return
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

    def _fast_path(self) -> tuple[Any, int, Any, Any, Any] | None:
        """(socket, its descriptor, parser, its hiredis reader, its not-enough-data mark) of
        the connection when the loop may read and write it without redis-py's per-reply
        wrappers (each can_read polled the socket, then polled it again and peeked at it)
        and without the poll CPython's socket makes before each recv and send on a socket
        with a timeout, else None: not connected, a TLS socket (its decrypted bytes wait
        above the socket, where a poll does not see them), a descriptor in blocking mode (a
        socket without a timeout: a read would wait) or a parser that is not hiredis's."""
        conn = self._conn
        sock = getattr(conn, "_sock", None)
        fast = self._fast
        if fast is not None and fast[0] is sock:
            return fast
        self._fast = None
        parser = getattr(conn, "_parser", None)
        reader = getattr(parser, "_reader", None)
        if type(sock) is not socket.socket or not isinstance(reader, hiredis.Reader):
            return None
        fd = sock.fileno()
        if fd < 0 or os.get_blocking(fd):
            return None
        try:
            from redis._parsers.hiredis import NOT_ENOUGH_DATA
        except ImportError:  # another redis-py: its own path
            return None

        self._fast = (sock, fd, parser, reader, NOT_ENOUGH_DATA)
        return self._fast

    def _read_now(self, sock: Any, fd: int, parser: Any, reader: Any, more: object) -> None:
        """The replies that have arrived, as redis-py's reader parses them (an error reply is
        its ResponseError, a connection error raised, a RESP3 push handed to the parser as
        redis-py does); never waits: the descriptor is non-blocking, read with one read(2)
        (no poll first: the loop reads when its selector found the socket readable, and a
        read that finds nothing costs what a poll would). A read shorter than RECV_SIZE took
        all the socket held: no second read for its EAGAIN; what arrives later makes the
        socket readable again for the loop's selector (level-triggered)."""
        inflight = self.inflight
        push = getattr(hiredis, "PushNotification", None)
        drained = False
        while inflight:
            reply = reader.gets()
            if reply is more:
                if drained:
                    return
                try:
                    chunk = os.read(fd, RECV_SIZE)
                except (BlockingIOError, InterruptedError):
                    return
                if not chunk:
                    raise redis.ConnectionError("Connection closed by server.")
                reader.feed(chunk)
                drained = len(chunk) < RECV_SIZE
                continue
            if isinstance(reply, redis.ConnectionError):
                raise reply  # as redis-py's read_response (LOADING, ...)
            if push is not None and isinstance(reply, push):
                parser.handle_push_response(reply)
                continue
            if isinstance(reply, list) and reply and isinstance(reply[0], redis.ConnectionError):
                raise reply[0]
            batch = inflight[0]
            batch.replies.append(reply)
            if len(batch.replies) == batch.size:
                inflight.popleft()
                batch.on_reply(batch.replies)

    def fail(self, exc: BaseException) -> None:
        """The connection broke: every batch in flight gets `on_error`."""
        batches = list(self.inflight)
        self.reset()
        for batch in batches:
            batch.on_error(exc)

    def reset(self) -> None:
        self.inflight.clear()
        self._fast = None
        if self._conn is not None:
            self._conn.disconnect()
            self._client.connection_pool.release(self._conn)
            self._conn = None

    def close(self) -> None:
        self.reset()
        self._client.close()
