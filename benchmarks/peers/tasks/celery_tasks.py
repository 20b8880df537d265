"""celery app and tasks (broker from BENCH_REDIS_URL, celery's defaults otherwise)."""

import os

from celery import Celery
from tasks import _shared

app = Celery("bench", broker=os.environ["BENCH_REDIS_URL"])


@app.task
def noop():
    _shared.noop()


@app.task
def stamp(i):
    _shared.stamp(i)
