"""dramatiq actors on a RedisBroker (dramatiq's default middleware)."""

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from tasks import _shared

broker = RedisBroker(url=os.environ["BENCH_REDIS_URL"])
dramatiq.set_broker(broker)


@dramatiq.actor
def noop():
    _shared.noop()


@dramatiq.actor
def stamp(i):
    _shared.stamp(i)
