"""The heartbeat thread: bumps this client's expiry on every listened queue.

It runs on its own connection so a busy scheduling loop cannot starve it. When a bump says
the client was already swept, it sets `swept` and wakes the scheduling loop.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping

import redis

from ..errors import ConnectionFailed, QueasyError
from ..store.connection import loop_client
from ..store.library import Status, ensure_loaded, fcall
from ..store.upgrading import maybe_upgrading, upgraded, upgrading
from .outage import redirect_log, redirected
from .registry import Registry

log = logging.getLogger("queasy_py")


def queue_error(exc: BaseException) -> bool:
    """Whether `exc`, a queue's bump refused, is that queue's own: an error raised in the
    library's code by a key of the queue (written around the library: WRONGTYPE, a value it
    cannot read) or the conversion of its 4.x keys failing, which no retry mends. Not an
    error of the server (its library gone, read-only, loading, out of memory, a slot moving:
    those fail the whole beat, as before)."""
    if isinstance(exc, QueasyError):
        return True
    text = str(exc)
    return (
        type(exc) is redis.exceptions.ResponseError
        and "function not found" not in text.lower()
        and ("script:" in text or "user_function" in text)
    )


def expiry_ms(interval: float) -> int:
    """A client is dead when it missed its heartbeats for twice their interval."""
    return int(interval * 2000)


class ServerClock:
    """How far the server's clock is ahead of this host's (seconds, measured by each beat):
    times the server sends (next run_at, wake-ups) are compared with this host's clock.

    A measure's error is up to half its round trip, which a reconnect inside the beat, a
    server slow to answer or a thread kept waiting makes long (a beat that reconnected for
    0.55 s after a fault put the offset 0.275 s ahead: a schedule's catch-up then moved an
    occurrence that early). The offset is that of the shortest round trip among the last
    SAMPLES measures (NTP's clock filter, in small)."""

    SAMPLES = 8

    def __init__(self) -> None:
        self.offset = 0.0
        self._samples: deque[tuple[float, float]] = deque(maxlen=self.SAMPLES)

    def local(self, server_ms: int) -> float:
        """A server time (ms since the epoch) on this host's clock, in seconds."""
        return server_ms / 1000.0 - self.offset

    def server_ms(self, local: float) -> int:
        """This host's time `local` (seconds since the epoch) on the server's clock, in ms."""
        return int((local + self.offset) * 1000)

    def measure(self, server: tuple[int, int], before: float, after: float) -> None:
        """From a TIME reply (seconds, µs) read between `before` and `after` (time.time())."""
        self._samples.append((after - before, server[0] + server[1] / 1e6 - (before + after) / 2))
        self.offset = min(self._samples)[1]


class Heartbeat(threading.Thread):
    def __init__(
        self,
        url: str,
        bases: Mapping[str, int],  # base key -> events maxlen (for the events of a sweep)
        client_id: Callable[[], str],
        interval: float,
        wake: Callable[[], None],
        registry: Registry | None = None,
    ) -> None:
        super().__init__(name="queasy-heartbeat", daemon=True)
        self.registry = registry  # what this supervisor publishes about itself
        self.url = url
        self.bases = dict(bases)
        self.client_id = client_id
        self.interval = interval
        self.wake = wake
        self.swept = threading.Event()
        self.swept_id = ""  # the client id a beat found swept
        self.failed = threading.Event()  # set on a failed beat: the supervisor reconciles
        self.stopped = threading.Event()
        self._kick = threading.Event()
        self.failing = False  # the last beat failed (logged once until one works again)
        self.redirects = redirect_log  # a cluster's slot moving: a WARNING now and then
        self.errors = 0  # beats that failed (/metrics: queasy_redis_errors_total)
        self.last_ok = time.monotonic()
        #: queues whose bump fails on their own keys (queue_error): base -> the error logged
        self.broken: dict[str, str] = {}
        self._redis: redis.Redis | None = None
        self.clock = ServerClock()

    @property
    def expiry_ms(self) -> int:
        return expiry_ms(self.interval)

    def beat(self, r: redis.Redis, client_id: str) -> bool:
        """Bump every queue (and read the server's clock, and publish this supervisor's
        entry in the registry); False when this client was swept."""
        cluster = hasattr(r, "get_primaries")  # a cluster's pipeline refuses TIME
        if cluster:  # each bump goes to its queue's primary; the clock is read apart
            before = time.time()
            self.clock.measure(r.time(), before, time.time())
        with r.pipeline(transaction=False) as pipe:
            if not cluster:
                pipe.time()
            for base, maxlen in self.bases.items():
                fcall(pipe, "queasy_bump", [base], ["", client_id, self.expiry_ms, maxlen])
            server_now = time.time() + self.clock.offset
            if self.registry is not None:
                self.registry.add(pipe, client_id, server_now, self.expiry_ms / 1000.0)
            before = time.time()
            replies = pipe.execute(raise_on_error=False)
            if not cluster:
                server, *replies = replies
                if isinstance(server, Exception):
                    raise server
                self.clock.measure(server, before, time.time())
        for reply in replies[len(self.bases) :]:  # the registry's commands
            if isinstance(reply, Exception):
                raise reply
        statuses = self.bumped(r, client_id, replies[: len(self.bases)])
        if self.registry is not None:
            self.registry.prune(r, server_now)
        return all(int(s) != Status.SWEPT for s in statuses)

    def bumped(self, r: redis.Redis, client_id: str, replies: list[object]) -> list[object]:
        """The statuses of the bumps that worked, from the replies of the beat's bumps (one per
        queue, errors in place). A queue refused with 'TRYAGAIN upgrading' (keys of library
        4.x) is converted (queasy_upgrade) and bumped again. A queue whose bump fails on its
        own keys (queue_error: a conversion that fails every time, a key written around the
        library) is left out, with one ERROR naming it until it works again: the other
        queues' beat goes on (before, one such queue failed every beat, and the supervisor,
        never alive, ran no job of any queue). Any other error fails the whole beat."""
        out = []
        for (base, maxlen), reply in zip(self.bases.items(), replies, strict=True):
            if isinstance(reply, Exception) and upgrading(reply):
                try:
                    self.convert_one(r, base)
                    reply = fcall(r, "queasy_bump", [base], ["", client_id, self.expiry_ms, maxlen])
                except (redis.ResponseError, QueasyError) as exc:
                    reply = exc
            if isinstance(reply, Exception):
                if not queue_error(reply):
                    raise reply
                if base not in self.broken:
                    log.error(
                        "heartbeat of queue %s failed on its own keys (the other queues go "
                        "on; it gets no jobs until this is mended): %s",
                        base,
                        reply,
                    )
                self.broken[base] = str(reply)
                continue
            if self.broken.pop(base, None) is not None:
                log.warning("heartbeat of queue %s works again", base)
            out.append(reply)
        return out

    def beat_or_reload(self, r: redis.Redis, client_id: str) -> bool:
        """Beat; when the library is gone (FUNCTION FLUSH, a server restarted without its
        data), load it again and beat once more; when a queue still holds keys of library 4.x
        (its bump refused, 'TRYAGAIN upgrading'), convert them (queasy_upgrade, in this
        thread: the loop goes on) and beat once more."""
        try:
            return self.beat(r, client_id)
        except (redis.ResponseError, redis.exceptions.ClusterError) as exc:
            if maybe_upgrading(exc):
                self.convert(r)
                return self.beat(r, client_id)
            if "function not found" not in str(exc).lower():
                raise
            log.warning("the queasy library is gone; loading %s again", ensure_loaded(r))
            return self.beat(r, client_id)

    def convert(self, r: redis.Redis) -> None:
        """Convert the 4.x keys of every listened queue to library 5.0's layout (a queue in
        that layout answers at once); a queue that cannot be converted is logged (ERROR,
        naming it) and left as it is."""
        for base in self.bases:
            try:
                self.convert_one(r, base)
            except (redis.ResponseError, QueasyError) as exc:
                log.error("the keys of library 4.x of %s cannot be converted: %s", base, exc)

    def convert_one(self, r: redis.Redis, base: str) -> None:
        """Convert the 4.x keys of queue `base` (queasy_upgrade until done)."""
        started, steps = time.monotonic(), itertools.count(1)

        def step() -> object:
            next(steps)
            return r.fcall("queasy_upgrade", 1, base, "")

        upgraded(step)
        done = next(steps) - 1
        if done > 1:
            log.info(
                "converted the keys of library 4.x of %s to library 5.0 (%d steps, %.1f s)",
                base,
                done,
                time.monotonic() - started,
            )

    def run(self) -> None:
        while True:
            self._kick.wait(self.interval)
            self._kick.clear()
            if self.stopped.is_set():
                break
            try:
                if self._redis is None:
                    self._redis = loop_client(self.url)  # each beat waits a bounded time
                client_id = self.client_id()
                if self.beat_or_reload(self._redis, client_id):
                    self.last_ok = time.monotonic()
                else:
                    self.swept_id = client_id  # the id swept: the loop may have a new one
                    self.swept.set()
                if self.failing:
                    log.warning("heartbeat works again")
                    self.failing = False
            except (redis.RedisError, OSError, ConnectionFailed) as exc:
                self.errors += 1
                if not self.failing and redirected(exc):  # a cluster's slot moving
                    self.redirects("heartbeat", exc)
                else:
                    if not self.failing:  # one line per outage, not one per beat
                        log.error("heartbeat failed: %s", exc)
                    self.failing = True
                self.failed.set()
                if self._redis is not None:
                    self._redis.close()
                self._redis = None
            except Exception:
                log.exception("heartbeat failed")
            self.wake()  # the loop learns of the result (it may wait for it after a freeze)
        if self._redis is not None:
            self._redis.close()

    def kick(self) -> None:
        """Beat now (the loop woke from a freeze and must learn whether it was swept)."""
        self._kick.set()

    def stop(self) -> None:
        self.stopped.set()
        self._kick.set()
