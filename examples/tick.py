"""Example periodic job: do the work, then dispatch the next run under the same id."""

from __future__ import annotations

import time

from queasy_py import Job
from queasy_py.context import current_client


def handle(data: dict, job: Job) -> None:
    print(f"tick {data['n']} at {time.strftime('%X')}", flush=True)
    current_client().queue(job.queue).dispatch(
        {"n": data["n"] + 1}, id=job.id, delay=data.get("every", 1.0), update_run_at="if_earlier"
    )
