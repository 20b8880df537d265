"""Wake-ups: the queues' wake channels (PUBLISHed by dispatch), read inside the scheduling
loop, so an idle supervisor picks up a new job within a millisecond instead of polling.

The pub/sub socket is watched by the loop's selector (no thread, no hand-off between threads).
When the connection breaks, the loop keeps polling every poll_interval and this reconnects
with backoff.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import redis

from .connection import connect
from .errors import ConnectionFailed

log = logging.getLogger("queasy_py")


class Wakeup:
    def __init__(self, url: str, channels: Mapping[str, str]) -> None:
        """`channels` maps a wake channel to its queue name."""
        self.url = url
        self.channels = dict(channels)
        self._redis: redis.Redis | None = None
        self._pubsub: Any = None
        self.retry_at = 0.0
        self.delay = 0.1

    def fileno(self) -> int | None:
        sock = getattr(getattr(self._pubsub, "connection", None), "_sock", None)
        return None if sock is None else sock.fileno()

    def ensure(self) -> None:
        """Connect and subscribe when not connected and the backoff has passed."""
        if self._pubsub is not None or time.monotonic() < self.retry_at:
            return
        try:
            self._redis = connect(self.url, attempts=1)
            self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            self._pubsub.subscribe(*self.channels)
            self.delay = 0.1
        except (redis.RedisError, OSError, ValueError, ConnectionFailed) as exc:
            self._broken(exc)

    def read(self) -> list[tuple[str, float]]:
        """The (queue name, run_at seconds) of every wake-up message that has arrived."""
        out: list[tuple[str, float]] = []
        if self._pubsub is None:
            return out
        try:
            while True:
                message = self._pubsub.get_message(timeout=0.0)
                if message is None:
                    if not self._pubsub.connection.can_read(timeout=0):
                        return out
                    continue
                name = self.channels.get(message["channel"].decode())
                if name is not None:
                    out.append((name, int(message["data"]) / 1000.0))
        except (redis.RedisError, OSError, ValueError) as exc:
            self._broken(exc)
            return out

    def _broken(self, exc: BaseException) -> None:
        log.warning(
            "wake-up listener lost its connection: %s (polling meanwhile; retry in %.1fs)",
            exc,
            self.delay,
        )
        self.close()
        self.retry_at = time.monotonic() + self.delay
        self.delay = min(self.delay * 2, 5.0)

    def close(self) -> None:
        if self._pubsub is not None:
            try:
                self._pubsub.close()
            except (redis.RedisError, OSError):
                pass
        if self._redis is not None:
            self._redis.close()
        self._pubsub = self._redis = None
