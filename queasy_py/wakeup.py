"""The wake-up thread: listens to the queues' wake channels (PUBLISHed by dispatch) so an
idle supervisor picks up a new job within milliseconds instead of polling."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping

import redis

from .connection import connect
from .errors import ConnectionFailed

log = logging.getLogger("queasy_py")


class Wakeup(threading.Thread):
    def __init__(self, url: str, channels: Mapping[str, str], wake: Callable[[], None]) -> None:
        """`channels` maps a wake channel to its queue name."""
        super().__init__(name="queasy-wakeup", daemon=True)
        self.url = url
        self.channels = dict(channels)
        self.wake = wake
        self.inbox: queue.SimpleQueue[tuple[str, float]] = queue.SimpleQueue()
        self.stopped = threading.Event()

    def run(self) -> None:
        delay = 0.1
        while not self.stopped.is_set():
            r = None
            try:
                r = connect(self.url, attempts=1)
                pubsub = r.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(*self.channels)
                delay = 0.1
                while not self.stopped.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message is None:
                        continue
                    name = self.channels.get(message["channel"].decode())
                    if name is not None:
                        self.inbox.put((name, int(message["data"]) / 1000.0))
                        self.wake()
                pubsub.close()
            except (redis.RedisError, OSError, ValueError, ConnectionFailed) as exc:
                log.warning("wake-up listener lost its connection: %s (polling meanwhile)", exc)
                self.stopped.wait(delay)
                delay = min(delay * 2, 5.0)
            finally:
                if r is not None:
                    r.close()

    def stop(self) -> None:
        self.stopped.set()

    def drain(self) -> list[tuple[str, float]]:
        out = []
        while True:
            try:
                out.append(self.inbox.get_nowait())
            except queue.Empty:
                return out
