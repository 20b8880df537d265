"""Fail handler that keeps a periodic job alive: re-dispatch the failed job by its id.

    queue.listen("myapp.hourly", fail_handler="handlers.reschedule")

A periodic job re-dispatches itself (same id, update_run_at="if_earlier") when it runs. If it
fails for good, or its worker keeps crashing, this handler dispatches it again with its
original id and data after DELAY seconds (env QUEASY_RESCHEDULE_DELAY, default 60), so the
chain never silently dies. A waiting copy with that id (the job rescheduled itself before
failing) is kept: its data wins and the earlier run_at wins.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from queasy_py import Job
from queasy_py.context import current_client

DELAY = float(os.environ.get("QUEASY_RESCHEDULE_DELAY", "60"))

log = logging.getLogger("queasy_py.handlers.reschedule")


def handle(data: list[Any], job: Job) -> None:
    original_data, original_job, error = data
    queue = current_client().queue(original_job["queue"])
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
        original_job["queue"],
        error.get("name"),
        error.get("message"),
        DELAY,
    )
