"""arq worker settings (arq's defaults: max_jobs 10, poll_delay 0.5 s, results kept 1 h)."""

import os

from arq.connections import RedisSettings
from tasks import _shared


async def noop(ctx):
    await _shared.anoop()


async def stamp(ctx, i):
    await _shared.astamp(i)


class WorkerSettings:
    functions = [noop, stamp]
    redis_settings = RedisSettings.from_dsn(os.environ["BENCH_REDIS_URL"])
