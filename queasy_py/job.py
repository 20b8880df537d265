"""What a job looks like to producers (JobInfo) and to handlers (Job)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

State = Literal["waiting", "delayed", "blocked", "active"]


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A job as stored: returned by Queue.get_job()."""

    id: str
    queue: str
    data: Any
    state: State
    run_at: float  # epoch seconds
    retry_count: int
    stall_count: int
    timeout_count: int


@dataclass(frozen=True, slots=True)
class Job:
    """The second argument of a handler's handle(data, job)."""

    id: str
    queue: str
    run_at: float
    retry_count: int
    stall_count: int
    timeout_count: int
