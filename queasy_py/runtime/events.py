"""What the scheduling loop waits on: one selector over the worker pipes and exit sentinels,
the Redis sockets (round pipe, pub/sub) and a self-pipe that wakes it (signals, other threads).
"""

from __future__ import annotations

import os
import selectors
from typing import Any


class Events:
    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.selector.register(self.wake_r, selectors.EVENT_READ, ("wake", None))
        self.watched: dict[str, Any] = {}
        self.seen: dict[str, Any] = {}  # the object watch() was last given, by kind

    def wake(self) -> None:
        """Make select() return (thread-safe, signal-safe)."""
        try:
            os.write(self.wake_w, b"w")
        except BlockingIOError:
            pass  # the pipe is full: the loop is awake anyway

    def drain_wake(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def select(self, timeout: float) -> list[tuple[selectors.SelectorKey, int]]:
        return self.selector.select(timeout)

    def register(self, fd: int, data: tuple[str, Any]) -> None:
        """Watch `fd`. A registration under the same number is stale (a live descriptor has
        one number): its socket was closed, and its kind registers its new socket anew."""
        stale = self.selector.get_map().get(fd)
        if stale is not None:
            self.selector.unregister(fd)
            if stale.data[0] in self.watched:
                self.watched[stale.data[0]] = None
                self.seen.pop(stale.data[0], None)
        self.selector.register(fd, selectors.EVENT_READ, data)

    def want_write(self, fd: int, on: bool) -> None:
        """Also wake when `fd` is writable (it has output waiting), or no longer."""
        key = self.selector.get_map().get(fd)
        if key is None:
            return
        mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if on else 0)
        if key.events != mask:
            self.selector.modify(fd, mask, key.data)

    def unregister(self, fd: int) -> None:
        try:
            self.selector.unregister(fd)
        except (KeyError, ValueError, OSError):
            pass

    def watch(self, kind: str, sock: Any) -> None:
        """Keep the selector watching the socket of `kind` ('redis': the round pipe,
        'pubsub': wake-ups and pushes), or its tuple of sockets (a cluster: one per primary);
        it changes on a reconnect. Sockets are compared as objects: a new socket may reuse
        the number of a closed one, of either kind."""
        if kind in self.seen and self.seen[kind] is sock:  # the loop's usual call: no change
            return
        socks = sock if isinstance(sock, tuple) else (sock,)
        known = self.watched.get(kind)
        if known is not None and len(known) == len(socks):
            if all(a is b for a, b in zip(known, socks, strict=True)):
                self.seen[kind] = sock
                return
        self.watched[kind] = socks
        self.seen[kind] = sock
        for key in list(self.selector.get_map().values()):
            if key.data == (kind, None):
                self.selector.unregister(key.fileobj)
        for one in socks:
            fd = -1 if one is None else one.fileno()
            if fd >= 0:
                self.register(fd, (kind, None))

    def close(self) -> None:
        self.selector.close()
        os.close(self.wake_r)
        os.close(self.wake_w)
