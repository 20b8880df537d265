"""Fail handler of the periodic queue: record, then queasy_py.handlers.reschedule keeps the id
alive."""

from __future__ import annotations

from typing import Any

from queasy_py import Job
from queasy_py.handlers import reschedule

from . import ended_on_error, record
from .failed import start


def handle(data: list[Any], job: Job) -> None:
    start(data, job)
    with ended_on_error(job):
        reschedule.handle(data, job)
    record("end", q=job.queue, id=job.id)
