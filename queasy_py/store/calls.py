"""The producer's writes on one server: sent once (a lean FCALL for the hot path too).

redis-py's command path costs tens of microseconds per call in Python (retry policy, pool
checkout, observability hooks). Here each thread keeps one connection of the client's pool and
speaks to it directly. Measured: +15-20% on a dispatch loop (see README).

Every producer call that writes goes through here (dispatch, dispatch_many and dispatch_batch
pipelined, cancel, requeue_failed, purge, reset_totals, drop_schedule): redis-py reports a
reply lost after the command went out as it reports a connection never made ("cannot reach
Redis"), and with a URL's retry options it sends the command again; a write sent twice is not
the same write (a dispatch_many sent again after its jobs started makes blocked copies of
them, a job run twice; a cancel or a purge sent again removes what was dispatched in
between). Reads go through redis-py.

A call is sent again only when it cannot have reached the server: a connection found closed
before sending (the server restarted) is replaced first, and a send of one command that fails
is retried once on a new connection (a failed send never hands the whole command to the
kernel). A reply lost after the command was sent, or a pipeline whose send failed (its first
commands may have gone), is never retried (the server may have applied it); it raises
ConnectionFailed saying so (marked `_reply_lost`: connfailed.py names the public call). A
call the server refused with "Function not found" did not run: it is sent again once the
library is loaded (the version handshake, store/reloading.py); so is a call refused with
'TRYAGAIN upgrading' (its queue's keys of library 4.x being converted: nothing ran but a step
of that), once queasy_upgrade has converted the rest.

The connection of a thread that ended goes back to the pool (the next thread to need one
takes it): a thread per request left one open connection per thread ever started.

A process forked from one that used the client takes connections of its own: the forking
thread's connection is in the child's copy of its thread-local storage, and the two
processes sent on the one socket (their commands interleaved, each read the other's replies
or the server closed the connection on the garbled protocol).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

import hiredis
import redis

from ..errors import ConnectionFailed
from .reload import gone_calls, put_back, raise_first, sent_again_if_gone
from .upgrading import (
    sent_again_if_upgrading,
    upgrade_call,
    upgraded,
    upgrading_calls,
)

if TYPE_CHECKING:
    from .reloading import ReloadingRedis


class _Held:
    """A thread's connection, in its thread-local storage: dropped when the thread ends,
    which puts the connection on FastCall._ended (weakref.finalize)."""

    __slots__ = ("__weakref__", "conn", "ended")

    def __init__(self, conn: Any, ended: deque) -> None:
        self.conn = conn
        self.ended = weakref.finalize(self, ended.append, conn)


class FastCall:
    def __init__(self, client: ReloadingRedis) -> None:
        self._client = client
        self._local = threading.local()
        #: connections of threads that ended, for the pool (a finalizer takes no lock)
        self._ended: deque[Any] = deque()
        self._pid = os.getpid()  # the process whose connections these are

    def __call__(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """FCALL `name`: its reply (a ResponseError raised as it is). Refused because the
        server lost the library (nothing ran): sent again once it is loaded (_reload)."""
        packed = hiredis.pack_command(("FCALL", name, len(keys), *keys, *args))
        return sent_again_if_upgrading(
            lambda: sent_again_if_gone(lambda: self._one(packed, name), self._reload),
            lambda: self._upgrade_all(keys),
        )

    def _upgrade_all(self, keys: list[str]) -> int:
        """Upgrade the queues of `keys` from library 4.x (queasy_upgrade until each is): a
        call refused with 'TRYAGAIN upgrading' did nothing but a step of it. 0: all are."""
        for key in keys:
            upgraded(
                lambda key=key: self._one(hiredis.pack_command(upgrade_call(key)), "queasy_upgrade")
            )
        return 0

    def command(self, *parts: Any) -> Any:
        """Any other write (DEL), sent as an FCALL is."""
        return self._one(hiredis.pack_command(parts), str(parts[0]))

    def pipelined(self, name: str, keys: list[str], chunks: list[list[Any]]) -> list[Any]:
        """FCALL `name` once per chunk of arguments, pipelined in one round trip: their
        replies, or the first error reply raised once all were read. The calls refused
        because the server lost the library (none of them ran) are sent again, pipelined in
        their order, once it is loaded (_reload)."""
        replies = self._pipelined(name, keys, chunks)
        gone = gone_calls(replies)
        if gone:
            self._reload()
            put_back(replies, gone, self._pipelined(name, keys, [chunks[i] for i in gone]))
        refused = upgrading_calls(replies)  # (the queue's upgrade from library 4.x: none ran)
        if refused:
            self._upgrade_all(keys)
            put_back(replies, refused, self._pipelined(name, keys, [chunks[i] for i in refused]))
        return raise_first(replies)

    def _reload(self) -> None:
        """Load the library a call found gone: the version handshake, and its WARNING
        (store/reloading.ReloadingRedis, the client's redis.Redis)."""
        self._client.load_library(gone=True)

    def _pipelined(self, name: str, keys: list[str], chunks: list[list[Any]]) -> list[Any]:
        """pipelined's round trip: the replies, an error reply in its place."""
        packed = b"".join(
            hiredis.pack_command(("FCALL", name, len(keys), *keys, *args)) for args in chunks
        )
        what = f"{len(chunks)} pipelined {name} calls"
        conn = self._ready()
        try:
            conn.send_packed_command([packed], check_health=False)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self._drop(conn)  # the first commands may have gone: never sent again
            raise lost_reply(what, exc) from exc
        except BaseException:
            self._drop(conn)
            raise
        replies: list[Any] = []
        for _ in chunks:
            try:
                replies.append(self._read(conn, what))
            except redis.ResponseError as exc:  # read whole: the connection stays in step
                replies.append(exc)
        return replies

    def _one(self, packed: bytes, name: str) -> Any:
        conn = self._ready()
        try:
            conn.send_packed_command([packed], check_health=False)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            self._drop(conn)  # nothing reached the server: send once more on a new one
            conn = self._ready()
            try:
                conn.send_packed_command([packed], check_health=False)
            except BaseException:
                self._drop(conn)
                raise
        except BaseException:
            self._drop(conn)
            raise
        return self._read(conn, name)

    def _read(self, conn: Any, what: str) -> Any:
        """One reply: an error reply raised as it is, a lost one as lost_reply(what)."""
        try:
            return conn.read_response()
        except redis.ResponseError:
            raise
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self._drop(conn)
            raise lost_reply(what, exc) from exc
        except BaseException:
            self._drop(conn)  # interrupted mid-reply: the connection's state is unknown
            raise

    def _ready(self) -> Any:
        """This thread's connection, replaced when the server closed it (EOF readable)."""
        if self._pid != os.getpid():  # forked: the parent's connections are the parent's
            self._forked()
        held = getattr(self._local, "held", None)
        if held is not None:
            conn = held.conn
            try:
                stale = conn.can_read(timeout=0)
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                stale = True
            if not stale:
                return conn
            self._drop(conn)
        pool = self._client.connection_pool
        while self._ended:  # back to the pool: the get below takes one of them
            try:
                pool.release(self._ended.popleft())
            except IndexError:  # another thread took the last one
                break
        conn = pool.get_connection()
        self._local.held = _Held(conn, self._ended)
        return conn

    def _forked(self) -> None:
        """In a child process: forget the parent's connections, never touching their
        sockets (the parent's). redis-py's pool makes new ones in the child by itself."""
        held = getattr(self._local, "held", None)
        if held is not None:
            held.ended.detach()
        self._local, self._ended = threading.local(), deque()
        self._pid = os.getpid()

    def _drop(self, conn: Any) -> None:
        held, self._local.held = getattr(self._local, "held", None), None
        if held is not None:
            held.ended.detach()
        conn.disconnect()
        self._client.connection_pool.release(conn)


def lost_reply(what: str, exc: BaseException) -> ConnectionFailed:
    """The error of a write whose reply was lost after it was sent (`what`: its command, or
    the pipelined calls): it is not sent again. Raise it `from exc`."""
    failed = ConnectionFailed(
        f"the connection was lost before the reply to {what} came: the server may have "
        f"applied it ({exc})"
    )
    failed._reply_lost = True  # type: ignore[attr-defined]  # connfailed names the call
    return failed
