"""Handler of the periodic ids: re-dispatch itself (same id, run_at if earlier), then misbehave
at random like a work job. Sometimes it fails before re-dispatching:
queasy_py.handlers.reschedule, its fail handler, must then keep the chain alive."""

from __future__ import annotations

from typing import Any

from queasy_py import Job

from . import (
    PERIODIC_EVERY,
    PERIODIC_QUEUE,
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
    record_start(job, serial, act)
    # an invocation that may end well always re-dispatches first (else the chain would end);
    # one that fails does so half of the time, leaving the other half to the fail handler
    if act not in ("retry", "permanent", "exit") or rng.random() < 0.5:
        with ended_on_error(job):
            dispatch_recorded(
                PERIODIC_QUEUE,
                {"serial": new_serial(), "periodic": True},
                PERIODIC_EVERY,
                id=job.id,
                update_run_at="if_earlier",
            )
    misbehave(act, rng, job)
    record("end", q=job.queue, id=job.id)
