"""Handlers of the chaos test, run by `queasy run` supervisors in their worker processes.

Every handler appends records to one Redis stream (`records_key(prefix)`) so the orchestrator
can check the invariants from outside. The stream lives on a server of its own ($CHAOS_RECORDS_URL,
set by the orchestrator), so the records are kept whatever the queue's server goes through
(write refusals, a freeze):

  ev=start    a handler began: q, id, serial, pid (worker), ppid (its supervisor), t (epoch s),
              run_at (what the job said), rc/sc/tc (its counts), nb (not-before of the data),
              act (what it chose to do), lc/lt (client id and leased_at of the job's active
              record, read at start: who held the lease when the handler began)
  ev=end      the handler's code is done (returned or about to raise): q, id, pid, t
  ev=exit     the handler is about to os._exit its own worker: q, id, pid, t
  ev=intent   about to dispatch a job (serial, q, id, nb); ev=dispatched once it was sent
Fail handlers' start records also carry oq, oid, oserial, err, kind of the failed job (and
ofire, its fire time, for an occurrence of a scheduled queue); a scheduled queue's start
records carry fire (the occurrence's fire time, epoch s).

The behaviour of an invocation is chosen by a Random seeded from $CHAOS_SEED, the job id,
its serial and its counts, so a run is reproducible as far as process timing allows.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from queasy_py import Job, Queue
from queasy_py.context import current_client
from queasy_py.defaults import FAIL_QUEUE_SUFFIX
from queasy_py.store.library import ensure_loaded

#: the three work queues, highest priority first; a finished job's follow-up goes to the next
WORK_QUEUES = ("high", "mid", "low")
PERIODIC_QUEUE = "periodic"
#: scheduled queues (listen(schedule=...), issue #16) and their schedule keys
SCHEDULED = {
    "sched-once": {"schedule": "*/2 * * * * *"},
    "sched-skip": {"schedule_every": 3, "catch_up": "skip"},
}
#: job timeout of every chaos queue (seconds); hang and spin last longer than this
TIMEOUT = 1.0
#: seconds between two runs of a periodic id
PERIODIC_EVERY = 1.0

#: (action, weight) of one invocation of a work or periodic handler
ACTIONS = (
    ("complete", 840),
    ("retry", 70),
    ("permanent", 35),
    ("slow", 20),  # finishes close to the timeout: races it
    ("hang", 15),
    ("spin", 5),
    ("exit", 15),
)


def records_key(prefix: str) -> str:
    """The stream every chaos handler records into."""
    return f"{prefix}:chaos:records"


def queue_named(name: str) -> Queue:
    """This worker's producer Queue of `name`; a fail queue shares its parent's hash tag."""
    client = current_client()
    if name.endswith(FAIL_QUEUE_SUFFIX):
        return client.queue(name[: -len(FAIL_QUEUE_SUFFIX)]).fail_queue
    return client.queue(name)


#: environment variable naming the records' server (the queue's server when unset)
RECORDS_URL_ENV = "CHAOS_RECORDS_URL"
_records: tuple[int, redis.Redis] | None = None


def records_redis() -> redis.Redis:
    """This process's connection to the records' server."""
    global _records
    if _records is None or _records[0] != os.getpid():
        url = os.environ.get(RECORDS_URL_ENV)
        conn = redis.Redis.from_url(url) if url else current_client().redis
        _records = (os.getpid(), conn)
    return _records[1]


def record(ev: str, **fields: Any) -> None:
    row = {"ev": ev, "pid": os.getpid(), "ppid": os.getppid(), "t": repr(time.time())}
    row.update({k: "" if v is None else str(v) for k, v in fields.items()})
    records_redis().xadd(records_key(current_client().prefix), row)


def record_start(job: Job, serial: str, act: str, nb: Any = None, **extra: Any) -> None:
    """The start record, with the lease holder of the job's active record at this moment."""
    t = time.time()
    # the active record's lease (library 4.0.0 keeps it in the holder's lease hash: read
    # through get_job, the library's reader of it)
    info = queue_named(job.queue).get_job(job.id)
    active = info is not None and info.state == "active"
    holder = info.client if active and info is not None else None
    leased_at = (
        str(round(info.started_at * 1000))
        if active and info is not None and info.started_at is not None
        else None
    )
    record(
        "start",
        t=repr(t),
        q=job.queue,
        id=job.id,
        serial=serial,
        run_at=repr(job.run_at),
        rc=job.retry_count,
        sc=job.stall_count,
        tc=job.timeout_count,
        nb=nb,
        act=act,
        lc=holder or "",
        lt=leased_at or "",
        **extra,
    )


def choose(job: Job, serial: str) -> tuple[str, random.Random]:
    seed = os.environ.get("CHAOS_SEED", "0")
    rng = random.Random(
        f"{seed}:{job.id}:{serial}:{job.retry_count}:{job.stall_count}:{job.timeout_count}"
    )
    names = [a for a, _ in ACTIONS]
    weights = [w for _, w in ACTIONS]
    return rng.choices(names, weights)[0], rng


def new_serial() -> str:
    return uuid.uuid4().hex


def dispatch_recorded(queue: str, data: dict[str, Any], delay: float, **kwargs: Any) -> str:
    """Dispatch `data` (which carries its serial) with an intent record before and a
    confirmation after, so a dispatch cut short by a kill is told apart from a lost job."""
    job_id = kwargs.pop("id", None) or data["serial"]
    nb = time.time() + delay
    data = {**data, "nb": nb}
    record("intent", serial=data["serial"], q=queue, id=job_id, nb=repr(nb))
    client = current_client()
    try:
        client.queue(queue).dispatch(data, id=job_id, delay=delay, **kwargs)
    except redis.ResponseError as exc:
        if "function not found" not in str(exc).lower():
            raise  # OOM and the like: the handler fails, its job is retried
        # the library was flushed: nothing was written; load it again, as a producer must
        ensure_loaded(client.redis)
        client.queue(queue).dispatch(data, id=job_id, delay=delay, **kwargs)
    record("dispatched", serial=data["serial"], q=queue, id=job_id)
    return job_id


@contextmanager
def ended_on_error(job: Job) -> Iterator[None]:
    """An end record when the block raises (a dispatch the queue's server refused): the
    handler is about to raise, and its attempt ends like one of the act `retry`."""
    try:
        yield
    except BaseException:
        record("end", q=job.queue, id=job.id)
        raise


def misbehave(act: str, rng: random.Random, job: Job) -> None:
    """Do what a failing `act` says; returns only for the acts that end normally."""
    from queasy_py import PermanentError

    if act == "retry":
        record("end", q=job.queue, id=job.id)
        raise RuntimeError("chaos: a retriable error")
    if act == "permanent":
        record("end", q=job.queue, id=job.id)
        raise PermanentError("chaos: a permanent error")
    if act == "slow":
        time.sleep(TIMEOUT * rng.uniform(0.6, 1.3))
    elif act == "hang":
        time.sleep(TIMEOUT * rng.uniform(1.1, 3.0))
    elif act == "spin":
        until = time.monotonic() + TIMEOUT * rng.uniform(1.5, 2.5)
        n = 0
        while time.monotonic() < until:
            n += 1
    elif act == "exit":
        record("exit", q=job.queue, id=job.id)
        os._exit(17)
