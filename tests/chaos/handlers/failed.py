"""Fail handler of the work queues: record that the failed job reached it."""

from __future__ import annotations

from typing import Any

from queasy_py import Job

from . import record, record_start


def start(data: list[Any], job: Job) -> None:
    original_data, original_job, error = data
    record_start(
        job,
        job.id,
        "fail",
        oq=original_job["queue"],
        oid=original_job["id"],
        oserial=original_data.get("serial") if isinstance(original_data, dict) else None,
        ofire=original_data.get("fire_at") if isinstance(original_data, dict) else None,
        err=error["name"],
        kind=error["kind"],
    )


def handle(data: list[Any], job: Job) -> None:
    start(data, job)
    record("end", q=job.queue, id=job.id)
