"""Handler of the scheduled queues (issue #16): record the run with its occurrence's fire
time, then misbehave at random like a work job; the supervisors create the next occurrence."""

from __future__ import annotations

from typing import Any

from queasy_py import Job

from . import choose, misbehave, record, record_start


def handle(data: dict[str, Any], job: Job) -> None:
    serial = f"{job.queue}:{data['fire_at']}"
    act, rng = choose(job, serial)
    record_start(job, serial, act, fire=repr(data["fire_at"]))
    misbehave(act, rng, job)
    record("end", q=job.queue, id=job.id)
