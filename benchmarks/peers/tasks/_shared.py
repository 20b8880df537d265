"""What every benchmark job does: a Redis INCR (completion counter) and, for latency jobs, an
HSET of its handler start time first. The connection is per process (re-made after a fork)."""

from __future__ import annotations

import os
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


def noop() -> None:
    conn().incr(DONE_KEY)


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
    await aconn().incr(DONE_KEY)


async def astamp(i: int) -> None:
    t = time.time()
    c = aconn()
    await c.hset(LAT_KEY, str(i), repr(t))
    await c.incr(DONE_KEY)
