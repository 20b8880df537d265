"""Fail handler of the periodic queue: record, then handlers.reschedule keeps the id alive."""

from __future__ import annotations

from typing import Any

from handlers import reschedule
from queasy_py import Job

from . import ended_on_error, record
from .failed import start


def handle(data: list[Any], job: Job) -> None:
    start(data, job)
    with ended_on_error(job):
        reschedule.handle(data, job)
    record("end", q=job.queue, id=job.id)
