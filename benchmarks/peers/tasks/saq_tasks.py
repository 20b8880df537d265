"""saq worker settings (saq's defaults: concurrency 10 per worker process)."""

import os

from saq import Queue
from tasks import _shared


async def noop(ctx):
    await _shared.anoop()


async def stamp(ctx, *, i):
    await _shared.astamp(i)


queue = Queue.from_url(os.environ["BENCH_REDIS_URL"], name="bench")

settings = {"queue": queue, "functions": [noop, stamp]}
