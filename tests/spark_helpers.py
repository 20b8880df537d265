"""Functions the Spark tests run inside Spark's Python workers (imported there by name:
tests/ is on the workers' PYTHONPATH, see the `spark` fixture of tests/test_spark.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import redis
from pyspark import TaskContext

ROWS_PER_TASK = 300


def fail_once(
    url: str, prefix: str, at: int, wait_ids: dict[int, tuple[str, str]]
) -> Callable[[int], float]:
    """A UDF n -> float(n) for a sink test of task retries, one task per ROWS_PER_TASK rows.

    The first attempt of a task gives NaN at its row `at`: the sink has dispatched the rows
    before it (Arrow batches smaller than `at`), then fails the task on the value JSON cannot
    hold. The second attempt waits, at its first row, until the jobs the first one dispatched
    are under way (wait_ids[task]: an id that must be active, one that must have finished), so
    the retried task sends the ids of a running and of a finished job again.
    """

    def udf(n: int) -> float:
        context = TaskContext.get()
        task, row = divmod(n, ROWS_PER_TASK)
        attempt = context.attemptNumber() if context is not None else 0
        if attempt == 0:
            if row != at:
                return float(n)
            r = redis.Redis.from_url(url)
            r.rpush(f"{prefix}:failed-attempts", task)
            r.close()
            return float("nan")
        if row == 0:
            wait_under_way(url, prefix, *wait_ids[task])
        return float(n)

    return udf


def wait_under_way(url: str, prefix: str, active: str, finished: str) -> None:
    r = redis.Redis.from_url(url, decode_responses=True)
    deadline = time.monotonic() + 60
    try:
        while True:
            records = [json.loads(x) for x in r.lrange(f"{prefix}:records", 0, -1)]
            started = {x["id"] for x in records if x["event"] == "start"}
            ended = {x["id"] for x in records if x["event"] == "end"}
            if active in started and active not in ended and finished in ended:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{active} never started or {finished} never ended")
            time.sleep(0.02)
    finally:
        r.close()
