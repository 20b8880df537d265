"""huey tasks on RedisHuey (huey's defaults: blocking dequeue, results stored)."""

import os

from huey import RedisHuey
from tasks import _shared

huey = RedisHuey("bench", url=os.environ["BENCH_REDIS_URL"])


@huey.task()
def noop():
    _shared.noop()


@huey.task()
def stamp(i):
    _shared.stamp(i)
