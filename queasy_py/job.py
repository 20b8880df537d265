"""What a job looks like to producers (JobInfo) and to handlers (Job); a queue's schedule
(ScheduleInfo)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

State = Literal["waiting", "delayed", "blocked", "active", "finished", "failed", "cancelled"]
#: the states of a job that has not ended, and those of a record kept after its end
LIVE_STATES = ("waiting", "delayed", "blocked", "active")
END_STATES = ("finished", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A job as stored: returned by Queue.get_job() and Queue.jobs().

    Times are epoch seconds, None when unknown. `started_at` is when the job was leased
    (active) or when its last run started (ended); `last_error` is the error of its last
    failed attempt, also while it waits for a retry: {"name", "kind", "message",
    "traceback" (None: none), "at"}. `worker_pid`, `client` (the supervisor's client id) and
    `host` are those that ran it (an active job: its client only). `result` is the handler's
    return value, kept when its queue stores results (see Queue.result). `data` is None in
    a listing that did not ask for it, and for a finished job kept as its end only (one that
    had no result to keep and did not fail before: README "Job records after the end")."""

    id: str
    queue: str
    data: Any
    state: State
    run_at: float  # epoch seconds
    retry_count: int
    stall_count: int
    timeout_count: int
    attempts: int = 0  # times it was leased (handed to a supervisor)
    enqueued_at: float | None = None  # when the dispatch that made it was
    started_at: float | None = None
    ended_at: float | None = None
    last_error: dict[str, Any] | None = None
    worker_pid: int | None = None
    client: str | None = None
    host: str | None = None
    result: Any = None


@dataclass(frozen=True, slots=True)
class Job:
    """The second argument of a handler's handle(data, job)."""

    id: str
    queue: str
    run_at: float
    retry_count: int
    stall_count: int
    timeout_count: int


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A queue's schedule as stored: returned by Queue.schedule_info() and Client.schedules().

    `fire_at` is the fire time of its current occurrence (job id `defaults.SCHEDULE_ID`), whose
    `state` is "waiting" or "delayed" (pending: it fires then), "active" (it runs), or None
    (none right now: it ended, and the next supervisor check creates the next one). Times are
    epoch seconds; `last_*` describe the last occurrence that ended (None before the first);
    `skipped` counts the fire times catch-up passed over."""

    queue: str
    spec: str  # "cron <expression> <timezone>" or "every <seconds>s"
    fire_at: float | None
    state: Literal["waiting", "delayed", "active"] | None
    last_fire_at: float | None
    last_outcome: Literal["finished", "failed", "cancelled"] | None
    last_ended_at: float | None
    skipped: int

    @property
    def next_fire_at(self) -> float | None:
        """When the pending occurrence fires (None while one runs or none exists)."""
        return self.fire_at if self.state in ("waiting", "delayed") else None
