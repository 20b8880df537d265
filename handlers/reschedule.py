"""Fail handler that keeps a periodic job alive: re-dispatch the failed job by its id.

    queue.listen("myapp.hourly", fail_handler="queasy_py.handlers.reschedule")

A periodic job re-dispatches itself (same id, update_run_at="if_earlier") when it runs. If it
fails for good, or its worker keeps crashing, this handler dispatches it again with its
original id and data after DELAY seconds (env QUEASY_RESCHEDULE_DELAY, default 60), so the
chain never silently dies. A waiting copy with that id (the job rescheduled itself before
failing) is kept: its data wins and the earlier run_at wins. It dispatches only into the queue
its fail queue belongs to; a record naming another queue is refused (PermanentError).

The failed occurrence of a queue's schedule (listen(schedule=...): job id SCHEDULE_ID) is not
dispatched again: the schedule creates its next occurrence itself, and the library refuses a
dispatch of that id into a scheduled queue (each such fail job would fail its 100 retries).
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from queasy_py import InvalidInput, Job
from queasy_py.context import current_client
from queasy_py.defaults import SCHEDULE_ID

from ._fail_record import fail_record


def _delay() -> float:
    """QUEASY_RESCHEDULE_DELAY, checked at import (listen() imports it), not at each failure."""
    raw = os.environ.get("QUEASY_RESCHEDULE_DELAY", "60")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise InvalidInput(f"QUEASY_RESCHEDULE_DELAY must be seconds >= 0, not {raw!r}")
    return value


DELAY = _delay()

log = logging.getLogger("queasy_py.handlers.reschedule")


def handle(data: list[Any], job: Job) -> None:
    # the queue comes from this fail job's own queue, never from the record (see _fail_record)
    original_data, original_job, error, name = fail_record(data, job)
    queue = current_client().queue(name)
    if original_job["id"] == SCHEDULE_ID and queue.schedule_info() is not None:
        log.warning(
            "the occurrence of the schedule of %s failed for good (%s: %s); not rescheduled: "
            "the schedule creates its next occurrence itself",
            name,
            error.get("name"),
            error.get("message"),
        )
        return
    queue.dispatch(
        original_data,
        id=original_job["id"],
        delay=DELAY,
        update_data=False,
        update_run_at="if_earlier",
        reset_counts=True,
    )
    log.warning(
        "job %s of %s failed for good (%s: %s); rescheduled in %gs",
        original_job["id"],
        name,
        error.get("name"),
        error.get("message"),
        DELAY,
    )
