"""What every benchmark job does: count itself done and, for latency jobs, an HSET of its
handler start time first. The connection is per process (re-made after a fork).

A no-op job adds 1 to an in-process counter that a daemon thread flushes with INCRBY every
5 ms, so the measure is the runtime's cost, not one Redis round trip per job made by the
handler (the same for every library). Where a process ends after each job (rq's fork-per-job
Worker: BENCH_SYNC_DONE=1) the job INCRs directly.
"""

from __future__ import annotations

import os
import threading
import time

import redis

DONE_KEY = "bench:done"
LAT_KEY = "bench:lat"

_sync: tuple[int, redis.Redis] | None = None
_async: tuple[int, object] | None = None


def url() -> str:
    return os.environ["BENCH_REDIS_URL"]


def conn() -> redis.Redis:
    global _sync
    if _sync is None or _sync[0] != os.getpid():
        _sync = (os.getpid(), redis.Redis.from_url(url()))
    return _sync[1]


_lock = threading.Lock()
_pending = 0
_flusher_pid = 0
FLUSH_EVERY = 0.005


def _flush_loop() -> None:
    global _pending
    while True:
        time.sleep(FLUSH_EVERY)
        with _lock:
            n, _pending = _pending, 0
        if n:
            conn().incrby(DONE_KEY, n)


def noop() -> None:
    global _pending, _flusher_pid
    if os.environ.get("BENCH_SYNC_DONE") == "1":
        conn().incr(DONE_KEY)
        return
    with _lock:
        _pending += 1
        if _flusher_pid != os.getpid():
            _flusher_pid = os.getpid()
            threading.Thread(target=_flush_loop, name="bench-flush", daemon=True).start()


def stamp(i: int) -> None:
    t = time.time()
    c = conn()
    c.hset(LAT_KEY, str(i), repr(t))
    c.incr(DONE_KEY)


def aconn():
    global _async
    if _async is None or _async[0] != os.getpid():
        import redis.asyncio as aredis

        _async = (os.getpid(), aredis.Redis.from_url(url()))
    return _async[1]


async def anoop() -> None:
    noop()


async def astamp(i: int) -> None:
    t = time.time()
    c = aconn()
    await c.hset(LAT_KEY, str(i), repr(t))
    await c.incr(DONE_KEY)
