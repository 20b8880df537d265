"""Wake-ups and pushed jobs: the queues' wake channels (SPUBLISHed by dispatch) and this
client's push channels (a job dispatch leased straight to this idle client), read inside the
scheduling loop, so an idle supervisor starts a new job within a millisecond, without polling.

The channels are sharded (SSUBSCRIBE): on a Redis Cluster each is read on the primary that
owns its queue's slot (store/clusterwake.py holds one Wakeup per primary); when the slot
moves, the server ends the subscription (sunsubscribe) and this reconnects as after a break.

The pub/sub socket is watched by the loop's selector (no thread, no hand-off between threads)
and read without blocking straight into a hiredis reader (redis-py's PubSub layers cost about
80 us a message, a tenth of a job's pick-up time; this costs a few).
When the connection breaks, `lost` is set (a pushed job may have been lost with it: the
supervisor reconciles its leases), the loop keeps polling every poll_interval, and this
reconnects with backoff.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

import hiredis
import redis

from ..errors import ConnectionFailed
from .connection import loop_client

log = logging.getLogger("queasy_py")

#: a message: (kind, queue name, data); kind is 'wake' or 'push' (the channel it came on)
Message = tuple[str, str, bytes]


class Wakeup:
    def __init__(
        self,
        url: str,
        channels: Mapping[str, tuple[str, str]],
        connect: Callable[[], redis.Redis] | None = None,
    ) -> None:
        """`channels` maps a channel to its (kind, queue name); `connect` makes the client
        (a cluster node's), by default one for `url`."""
        self.url = url
        self._connect = connect or (lambda: loop_client(url))
        self.channels = dict(channels)
        self._redis: redis.Redis | None = None
        self._conn: Any = None  # the redis-py connection (it did AUTH, TLS, SELECT)
        self._sock: Any = None  # its socket, non-blocking, read only here
        self._reader: Any = None
        self.retry_at = 0.0
        self.delay = 0.1
        self.lost = False  # the connection broke since the supervisor last looked

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def socket(self) -> Any:
        """The socket to watch, or None when not connected."""
        return self._sock

    def set_channels(self, channels: Mapping[str, tuple[str, str]]) -> None:
        """Listen on `channels` instead (a new client id): reconnect at once."""
        if dict(channels) == self.channels:
            return
        self.channels = dict(channels)
        if self._sock is not None:
            self.close()
            self.lost = True
        self.retry_at = 0.0
        self.ensure()

    def recheck(self) -> None:
        """Nothing to do on one server (a silent connection is found by the reconcile's
        unpark marks, which never arrive on it); ClusterWakeup reads the slot map again."""

    def ensure(self) -> None:
        """Connect and subscribe when not connected and the backoff has passed."""
        if self._sock is not None or time.monotonic() < self.retry_at:
            return
        try:
            self._redis = self._connect()  # connecting waits LOOP_REDIS_TIMEOUT at most
            self._conn = self._redis.connection_pool.get_connection()
            # one SSUBSCRIBE per channel: a cluster node refuses channels of several slots
            packed = [hiredis.pack_command(("SSUBSCRIBE", c)) for c in self.channels]
            self._conn.send_packed_command([b"".join(packed)], check_health=False)
            self._reader = hiredis.Reader()
            self._sock = self._conn._sock
            self._sock.setblocking(False)
            self.delay = 0.1
        except (redis.RedisError, OSError, ValueError, ConnectionFailed) as exc:
            self._broken(exc)

    def read(self, timeout: float = 0.0) -> list[Message]:
        """Every message that has arrived, waiting up to `timeout` seconds for the first."""
        out: list[Message] = []
        if self._sock is None:
            return out
        try:
            if timeout > 0:
                self._sock.settimeout(timeout)
                try:
                    first = self._sock.recv(65536)
                except TimeoutError:
                    return out
                finally:
                    self._sock.setblocking(False)
                self._feed(first)
            while True:
                try:
                    self._feed(self._sock.recv(65536))
                except (BlockingIOError, ssl.SSLWantReadError):
                    break
            while (reply := self._reader.gets()) is not False:
                if isinstance(reply, Exception):
                    raise reply
                if reply[0] == b"smessage":
                    route = self.channels.get(reply[1].decode())
                    if route is not None:
                        out.append((route[0], route[1], reply[2]))
                elif reply[0] == b"sunsubscribe":  # never asked for: the slot moved away
                    raise ConnectionError(f"the server ended the subscription to {reply[1]!r}")
            return out
        except (redis.RedisError, hiredis.HiredisError, OSError, ValueError) as exc:
            self._broken(exc)
            return out

    def _feed(self, data: bytes) -> None:
        if not data:
            raise ConnectionError("the server closed the connection")
        self._reader.feed(data)

    def _broken(self, exc: BaseException) -> None:
        log.warning(
            "wake-up listener lost its connection: %s (polling meanwhile; retry in %.1fs)",
            exc,
            self.delay,
        )
        self.close()
        self.lost = True
        self.retry_at = time.monotonic() + self.delay
        self.delay = min(self.delay * 2, 5.0)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.disconnect()
        if self._redis is not None:
            self._redis.close()
        self._conn = self._sock = self._reader = self._redis = None
