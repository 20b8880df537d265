"""Where retries are decided: a job's result (or its fate) becomes finish, retry or fail,
and each retry and failure is logged (WARNING per retry, its traceback at DEBUG; ERROR with
the traceback for a failure for good).

The decision uses the listening supervisor's options (config applies at dequeue time), not
anything stored with the job.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from ..options import ListenOptions
from ..validate import ms_not_before
from .pool import Running

log = logging.getLogger("queasy_py")


@dataclass(slots=True)
class Ack:
    """One acknowledgement to send: `op` is 'finish', 'retry' or 'fail'; `args` its ARGV group."""

    op: str
    base: str
    fail_base: str | None
    args: list[Any]
    alone: bool = False  # sent as its own FCALL (its group was refused: find the bad one)


def error_dict(
    name: str, message: str, kind: str, traceback: str | None = None
) -> dict[str, str | None]:
    """An error as a fail handler gets it: {name, message, kind, traceback (None: none)}."""
    return {"name": name, "message": message, "kind": kind, "traceback": traceback}


def finish(job: Running, base: str, pid: int, started: int, result: str = "") -> Ack:
    """Done; `result` is the handler's return value as JSON ('' when it is not stored)."""
    return Ack("finish", base, None, [job.id, job.token, pid, started, result])


#: a retry's run_at meaning "now" on the server's clock
NOW = "+0"
#: the most jobs one FCALL of finish, retry or fail acks (MAX_ACKS of lua/queasy.lua, which
#: refuses more): a group of more, as acks kept through an outage make, goes in several
MAX_ACKS = 1000


def after(seconds: float) -> str:
    """A retry's run_at `seconds` from now on the server's clock (the library adds it to its
    own TIME, so a supervisor whose clock is off does not shift its retries)."""
    return f"+{max(0, ms_not_before(seconds))}"


def ready_at(run_at: int | str, now: float, local: Callable[[int], float]) -> float:
    """When a retry sent with `run_at` (server ms, or after()'s '+ms') is ready, in this
    host's seconds (`local` converts a server time)."""
    if isinstance(run_at, str) and run_at.startswith("+"):
        return now + int(run_at[1:]) / 1000.0
    return local(int(run_at))


def retry(
    job: Running,
    base: str,
    run_at: int | str,
    kind: str,
    pid: int | str,
    started: int | str,
    error_name: str = "",
    message: str = "",
    traceback: str | None = None,
) -> Ack:
    """Back to waiting at `run_at`: ms since the epoch, or after(seconds) / NOW."""
    args = [job.id, job.token, run_at, kind, pid, started, error_name, message, traceback or ""]
    return Ack("retry", base, None, args)


def fail(
    job: Running,
    base: str,
    fail_base: str | None,
    error: dict[str, Any],
    pid: int | str,
    started: int | str,
) -> Ack:
    """Fail for good; with a fail queue, its job's data is [data, job, error] (data null when
    the stored data is not JSON: spliced in as it is, it could reshape the fail job's data)."""
    if fail_base is None:
        fail_id, fail_data = "", b""
    else:
        fail_id = uuid.uuid4().hex
        try:
            orjson.loads(job.data)
            data: Any = orjson.Fragment(job.data)
        except orjson.JSONDecodeError:
            data = None
        fail_data = orjson.dumps([data, job.record(), error])
    failed(job, error)
    args = [job.id, job.token, fail_id, fail_data, pid, started, error["name"], error["kind"]]
    args += [error["message"], error.get("traceback") or ""]
    return Ack("fail", base, fail_base, args)


def attempt(job: Running) -> int:
    """Which run of the job this was: 1 for its first."""
    return job.retry_count + job.stall_count + job.timeout_count + 1


def failed(job: Running, error: dict[str, Any]) -> None:
    """One ERROR line for a job failed for good, with its traceback when there is one."""
    trace = error.get("traceback")
    log.error(
        "job %s of %s failed for good (attempt %d, kind %s): %s: %s%s",
        job.id,
        job.queue,
        attempt(job),
        error["kind"],
        error["name"],
        error["message"],
        f"\n{trace.rstrip()}" if trace else "",
    )


def retrying(job: Running, error: dict[str, Any], delay: float, spec: ListenOptions) -> None:
    """One WARNING line for a retry; its traceback at DEBUG."""
    log.warning(
        "job %s of %s failed (attempt %d), retry %d of %d in %.3gs: %s: %s",
        job.id,
        job.queue,
        attempt(job),
        job.retry_count + 1,
        spec.max_retries,
        max(0.0, delay),
        error.get("name"),
        error.get("message"),
    )
    trace = error.get("traceback")
    if trace and log.isEnabledFor(logging.DEBUG):
        log.debug(
            "traceback of job %s of %s (attempt %d):\n%s",
            job.id,
            job.queue,
            attempt(job),
            str(trace).rstrip(),
        )


def backoff_seconds(spec: ListenOptions, retry_count: int) -> float:
    """min(max_backoff, min_backoff * 2**retry_count), times a jitter in [1, 1.25)."""
    return min(spec.max_backoff, spec.backoff(retry_count) * (1.0 + random.random() / 4))


def on_result(
    job: Running,
    spec: ListenOptions,
    base: str,
    fail_base: str | None,
    error: dict[str, Any] | None,
    pid: int,
    started: int,
    now: float,
    result: str = "",
) -> Ack:
    """The ack for a handler's result: `error` None on success (`result`: its return value
    as JSON when stored), else the worker's description."""
    if error is None:
        return finish(job, base, pid, started, result)
    kind = error.get("kind")
    trace = error.get("traceback")
    described = error_dict(
        str(error.get("name")),
        str(error.get("message")),
        "permanent",
        trace if isinstance(trace, str) else None,
    )
    if kind == "permanent":
        return fail(job, base, fail_base, described, pid, started)
    if job.retry_count >= spec.max_retries:
        described["kind"] = "retriable"
        return fail(job, base, fail_base, described, pid, started)
    retry_at = error.get("retry_at")
    run_at: int | str
    if isinstance(retry_at, int | float) and not isinstance(retry_at, bool):
        # a wall-clock time the handler chose (like dispatch's run_at): kept as it is;
        # one already past is "now" on the server's clock
        run_at = ms_not_before(retry_at) if retry_at > now else NOW
        delay = float(retry_at) - now
    else:
        delay = backoff_seconds(spec, job.retry_count)
        run_at = after(delay)
    retrying(job, described, delay, spec)
    name, message = described["name"] or "", described["message"] or ""
    return retry(job, base, run_at, "retry", pid, started, name, message, trace)


def on_dequeue(job: Running, spec: ListenOptions, base: str, fail_base: str | None) -> Ack | None:
    """A job dequeued past its stall or timeout limit fails without running its handler."""
    if job.stall_count >= spec.max_stalls:
        message = f"job stalled {job.stall_count} times (max_stalls={spec.max_stalls})"
        return fail(job, base, fail_base, error_dict("StallError", message, "stall"), "", "")
    if job.timeout_count >= spec.max_timeouts:
        message = f"job timed out {job.timeout_count} times (max_timeouts={spec.max_timeouts})"
        return fail(job, base, fail_base, error_dict("TimeoutError", message, "stall"), "", "")
    return None


def ack_headers(specs: dict[str, ListenOptions], host: str) -> dict[tuple[str, str], list]:
    """The ARGV after the client id of each ack FCALL, by (op, base key): the events maxlen;
    for finish and fail also the retention of their records (count, ms), this host and
    whether to notify result waiters (the queue stores results)."""
    out: dict[tuple[str, str], list] = {}
    for base, spec in specs.items():
        notify = int(spec.store_results)
        out[("retry", base)] = [spec.events_maxlen]
        for op, (count, seconds) in (("finish", spec.keep_finished), ("fail", spec.keep_failed)):
            out[(op, base)] = [spec.events_maxlen, count, int(seconds * 1000), host, notify]
    return out


def ack_commands(
    client_id: str, acks: list[Ack], headers: dict[tuple[str, str], list]
) -> tuple[list[tuple], list[list[Ack]]]:
    """The FCALLs of `acks`, one per (op, queue, fail queue) group of up to MAX_ACKS (an ack
    marked `alone` is its own group), and the acks of each; `headers` as made by
    ack_headers."""
    grouped: dict[tuple, list[Ack]] = defaultdict(list)
    for ack in acks:
        alone = id(ack) if ack.alone else None
        grouped[(ack.op, ack.base, ack.fail_base, alone)].append(ack)
    commands: list[tuple] = []
    groups = []
    for (op, base, fail_base, _), items in grouped.items():
        keys = [base] if fail_base is None else [base, fail_base]
        for start in range(0, len(items), MAX_ACKS):  # (after an outage: many kept acks)
            chunk = items[start : start + MAX_ACKS]
            args: list[Any] = ["FCALL", f"queasy_{op}", len(keys), *keys, "", client_id]
            args.extend(headers[(op, base)])
            for ack in chunk:
                args.extend(ack.args)
            commands.append(tuple(args))
            groups.append(chunk)
    return commands, groups
