"""Handler modules of the runtime tests (tests/test_runtime*.py).

Handlers run in worker subprocesses of a supervisor started by tests/supervisor_main.py, which
passes the test server's URL and the test's key prefix in $QUEASY_TEST_URL and
$QUEASY_TEST_PREFIX. Each handler appends what happened (a JSON object with the job, the
worker pid and the time) to the Redis list `<prefix>:records`, so tests assert on facts.

`act` and `act_async` do what the job's data asks (see `misbehave`); `fail_record` is a fail
handler that records the `[data, job, error]` it was given.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import redis

from queasy_py import PermanentError, RetryLater

_lock = threading.Lock()
_redis: redis.Redis | None = None


def conn() -> redis.Redis:
    global _redis
    with _lock:
        if _redis is None:
            # no socket timeout: a gate's BLPOP waits up to 60 s, and redis-py 8 gives every
            # connection a 5 s one (a gated job would fail after 5 s on a loaded machine)
            _redis = redis.Redis.from_url(
                os.environ["QUEASY_TEST_URL"], decode_responses=True, socket_timeout=None
            )
        return _redis


def key(name: str) -> str:
    return f"{os.environ['QUEASY_TEST_PREFIX']}:{name}"


def job_fields(job: Any) -> dict[str, Any]:
    names = ("id", "queue", "run_at", "retry_count", "stall_count", "timeout_count")
    return {name: getattr(job, name) for name in names}


def record(event: str, data: Any, job: Any, **extra: Any) -> None:
    """Append one record: {event, tag, pid, t, id, queue, run_at, counts..., **extra}."""
    tag = data.get("tag") if isinstance(data, dict) else None
    entry = {"event": event, "tag": tag, "pid": os.getpid(), "t": time.time(), **job_fields(job)}
    conn().rpush(key("records"), json.dumps({**entry, **extra}))


class KindPermanent(Exception):
    """Not a PermanentError, but its `kind` attribute says permanent."""

    kind = "permanent"


def attempt(job: Any) -> int:
    """0 on the first run of a job, then 1, 2, ... whatever ended the earlier runs."""
    return job.retry_count + job.stall_count + job.timeout_count


def misbehave(data: dict[str, Any], job: Any) -> float:
    """Do what `data` asks, on the first data["times"] attempts only (default: every attempt).

    Keys: "gate" (block until the test pushes to `<prefix>:gate:<name>`), "spin" (a CPU-bound
    loop that never ends), "exit" (os._exit with that code), "raise" ("permanent",
    "kind_permanent", "retriable" or "retry_later"), "message", "retry_in" (seconds, for
    retry_later). Returns the seconds the caller should sleep afterwards (data["sleep"]).
    """
    if attempt(job) >= data.get("times", float("inf")):
        return 0.0
    if "gate" in data and conn().blpop([key(f"gate:{data['gate']}")], timeout=60) is None:
        raise RuntimeError(f"gate {data['gate']!r} was never opened")
    if data.get("spin"):
        while True:
            pass
    if "exit" in data:
        os._exit(data["exit"])
    message = data.get("message", "")
    kind = data.get("raise")
    if kind == "permanent":
        raise PermanentError(message)
    if kind == "kind_permanent":
        raise KindPermanent(message)
    if kind == "retriable":
        raise ValueError(message)
    if kind == "retry_later":
        raise RetryLater(message, retry_at=time.time() + data["retry_in"])
    return float(data.get("sleep", 0.0))
