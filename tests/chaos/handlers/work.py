"""Handler of the work queues: misbehave at random, or complete and dispatch a follow-up job
into the next queue (data `hops` says how many more follow-ups the chain has)."""

from __future__ import annotations

from typing import Any

from queasy_py import Job

from . import (
    WORK_QUEUES,
    choose,
    dispatch_recorded,
    ended_on_error,
    misbehave,
    new_serial,
    record,
    record_start,
)


def handle(data: dict[str, Any], job: Job) -> None:
    serial = data["serial"]
    act, rng = choose(job, serial)
    record_start(job, serial, act, nb=repr(data["nb"]))
    misbehave(act, rng, job)
    if act in ("complete", "slow") and data["hops"] > 0:
        follow = WORK_QUEUES[(WORK_QUEUES.index(job.queue) + 1) % len(WORK_QUEUES)]
        delay = rng.choice((0.0, 0.0, 0.0, rng.uniform(0.05, 0.6)))
        with ended_on_error(job):  # the queue's server may refuse it (OOM): a retry
            dispatch_recorded(follow, {"serial": new_serial(), "hops": data["hops"] - 1}, delay)
    record("end", q=job.queue, id=job.id)
