"""Replies of the library's read functions made into Python values: JobInfo from a job's
record (queasy_get_job, queasy_jobs), counts (queasy_counts), and what Queue.result() makes
of an ended job. Shared by Queue and aio.AsyncQueue; numbers go through store.fields (never
an exception on a field written by hand)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from .errors import JobFailed, JobNotFound
from .job import END_STATES, JobInfo
from .store import fields
from .validate import MAX_DEPTH

#: the values of queasy_counts, in order
COUNTS = (
    "waiting",
    "delayed",
    "blocked",
    "active",
    "finished",
    "failed",
    "finished_last_minute",
    "failed_last_minute",
    "finished_last_hour",
    "failed_last_hour",
)


def _json(raw: Any) -> Any:
    """A JSON field as a value; the text itself when it is not JSON, or nested deeper than
    orjson writes (validate.MAX_DEPTH: the library takes up to 1000 levels, and every
    reader that prints a JobInfo, `queasy inspect` and `--json`, writes it with orjson):
    written around the library, a record of hostile data must not stop a listing."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return fields.text(raw)
    if isinstance(value, list | dict) and _brackets(raw) > MAX_DEPTH:  # (else it cannot be)
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError:
            return fields.text(raw)
    return value


def _brackets(raw: Any) -> int:
    """How many [ and { the text holds: more than its nesting depth."""
    text = raw.encode() if isinstance(raw, str) else bytes(raw)
    return text.count(b"[") + text.count(b"{")


def _seconds(raw: Any) -> float | None:
    value = fields.ms_to_seconds(raw, None)
    return None if value is None or value <= 0 else value


def last_error(f: dict[str, Any]) -> dict[str, Any] | None:
    """The error fields of a record as {name, kind, message, traceback, at}, or None."""
    name = fields.text(f.get("error_name"))
    if not name:
        return None
    return {
        "name": name,
        "kind": fields.text(f.get("error_kind")),
        "message": fields.text(f.get("error_message")),
        "traceback": fields.text(f.get("traceback")) or None,
        "at": _seconds(f.get("error_at")),
    }


def job_info(queue: str, row: Any) -> JobInfo | None:
    """A JobInfo from a {state, {field, value, ...}} reply; None for a nil reply."""
    if row is None:
        return None
    state, flat = fields.text(row[0]), row[1]
    f = {fields.text(flat[i]): flat[i + 1] for i in range(0, len(flat) - 1, 2)}
    started = f.get("leased_at") if state == "active" else f.get("started_at")
    pid = fields.to_int(f.get("pid"), 0)
    return JobInfo(
        id=fields.text(f.get("id")),
        queue=queue,
        data=_json(f["data"]) if "data" in f else None,
        state=state,  # type: ignore[arg-type]
        run_at=fields.ms_to_seconds(f.get("run_at"), 0.0),
        retry_count=fields.to_int(f.get("retry_count"), 0),
        stall_count=fields.to_int(f.get("stall_count"), 0),
        timeout_count=fields.to_int(f.get("timeout_count"), 0),
        attempts=fields.to_int(f.get("attempts"), 0),
        enqueued_at=_seconds(f.get("enqueued_at")),
        started_at=_seconds(started),
        ended_at=_seconds(f.get("ended_at")),
        last_error=last_error(f),
        worker_pid=pid if pid > 0 else None,
        client=fields.text(f.get("client")) or None,
        host=fields.text(f.get("host")) or None,
        result=_json(f["result"]) if "result" in f else None,
    )


def page(queue: str, row: list) -> tuple[list[JobInfo], str]:
    """The jobs of a queasy_jobs reply and the cursor of the next page ('0': none)."""
    jobs = [job_info(queue, item) for item in row[1:]]
    return [j for j in jobs if j is not None], fields.text(row[0])


def counts(row: list) -> dict[str, int]:
    values = (fields.to_int(value, 0) for value in row)
    return dict(zip(COUNTS, values, strict=True))


def live(entries: Iterable[Any], now: float) -> list[dict[str, Any]]:
    """The supervisor registry entries (JSON) whose expiry is not past `now` (server
    clock), sorted by host, then pid; entries that do not parse are left out."""
    out = []
    for raw in entries:
        try:
            entry = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        expires = entry.get("expires_at") if isinstance(entry, dict) else None
        if isinstance(expires, int | float) and expires >= now:
            out.append(entry)
    return sorted(out, key=lambda e: (str(e.get("host")), e.get("pid") or 0))


def publishes_ends(supervisors: list[dict[str, Any]], queue: str) -> bool:
    """Whether the ends of `queue`'s jobs are PUBLISHed on their channels: some live
    supervisor listens on it, and every one that does stores its results. Otherwise
    result() waits on the queue's outcome events (a supervisor without store_results
    publishes nothing, and one may start later)."""
    serving = [s for s in supervisors if queue in (s.get("queues") or ())]
    return bool(serving) and all(queue in (s.get("results") or ()) for s in serving)


def outcome(
    info: JobInfo | None,
    job_id: str,
    queue: str,
    ended: dict[str, Any] | None = None,
    results: bool = False,
) -> tuple[bool, Any]:
    """What result() makes of a job: (True, its result) once it finished, (False, None)
    while it has not ended; JobFailed when it failed or was cancelled, JobNotFound when
    there is no such job (or its record is no longer kept). `ended`: the end of the job the
    waiter saw since its last look (waits.Ends), which answers when the record is gone by
    now (a retention of count 0, or trimmed meanwhile); `results`: whether a supervisor of
    the queue may have stored its result (then a finished job whose record is gone took
    its result with it: JobNotFound saying so, never a None that was not the result)."""
    if info is None:
        if ended is not None:
            return _seen_end(ended, job_id, queue, results)
        raise JobNotFound(
            f"no job {job_id!r} in queue {queue!r} (never dispatched, or its record is no "
            "longer kept: see keep_finished and keep_failed)"
        )
    if info.state not in END_STATES:
        return False, None
    if info.state == "finished":
        return True, info.result
    error = cancelled_error(info.ended_at) if info.state == "cancelled" else info.last_error or {}
    raise JobFailed(
        f"job {job_id} of {queue} {info.state}: {error.get('name')}: {error.get('message')}",
        info,
        error,
    )


def cancelled_error(at: float | None) -> dict[str, Any]:
    """The error of a cancelled job."""
    return {
        "name": "Cancelled",
        "kind": "cancelled",
        "message": "the job was cancelled",
        "traceback": None,
        "at": at,
    }


def _seen_end(ended: dict[str, Any], job_id: str, queue: str, results: bool) -> tuple[bool, Any]:
    """outcome() of a job whose end the waiter saw and whose record is gone since: from the
    outcome event (or the channel's state: the supervisor that ended it stored results)."""
    state = ended["outcome"]
    gone = "keep_finished" if state == "finished" else "keep_failed"
    if state == "finished":
        if results or ended.get("channel"):
            raise JobNotFound(
                f"job {job_id} of {queue} finished, but its record, with its result, is no "
                f"longer kept (see {gone})"
            )
        return True, None  # a queue that stores no results: its result is None
    info = _ended_info(ended, job_id, queue)
    error = info.last_error or {}
    what = f"{error.get('name')}: {error.get('message')}" if error else "its error is gone"
    raise JobFailed(
        f"job {job_id} of {queue} {state}: {what} (its record is no longer kept: see {gone})",
        info,
        error,
    )


def _ended_info(ended: dict[str, Any], job_id: str, queue: str) -> JobInfo:
    """A JobInfo of an ended job from its outcome event (README "Outcome events"): what the
    event does not hold (data, attempts, host) is left at None or 0."""

    def at(name: str) -> float | None:
        value = ended.get(name)
        return value / 1000 if isinstance(value, int) and value > 0 else None

    def count(name: str) -> int:
        value = ended.get(name)
        return value if isinstance(value, int) else 0

    state, ended_at = ended["outcome"], at("ended_at")
    error: dict[str, Any] | None = None
    if state == "cancelled":
        error = cancelled_error(ended_at)
    elif ended.get("error_name"):
        error = {
            "name": ended["error_name"],
            "kind": ended.get("error_kind") or "",
            "message": ended.get("error_message") or "",
            "traceback": ended.get("traceback") or None,
            "at": ended_at,
        }
    return JobInfo(
        id=job_id,
        queue=queue,
        data=None,
        state=state,
        run_at=at("run_at") or 0.0,
        retry_count=count("retry_count"),
        stall_count=count("stall_count"),
        timeout_count=count("timeout_count"),
        enqueued_at=at("enqueued_at"),
        started_at=at("started_at"),
        ended_at=ended_at,
        last_error=error,
        worker_pid=count("pid") or None,
        client=ended.get("client") or None,
    )


def stores_results(supervisors: list[dict[str, Any]], queue: str) -> bool:
    """Whether some live supervisor listening on `queue` stores its results."""
    return any(
        queue in (s.get("queues") or ()) and queue in (s.get("results") or ()) for s in supervisors
    )


#: the newest kept ends of a state a waiter reads for the end of a job whose id is live again
ENDS_LOOKED_AT = 100


def ended_run(page: list[JobInfo], job_id: str, watched: JobInfo) -> JobInfo | None:
    """The kept end, among a page of the newest ends of a state, of the job `watched`
    (job_id's run a waiter waited for, whose id is live again): same id and dispatch."""
    for info in page:
        if info.id == job_id and info.enqueued_at == watched.enqueued_at:
            return info
    return None
