"""Where retries are decided: a job's result (or its fate) becomes finish, retry or fail.

The decision uses the listening supervisor's options (config applies at dequeue time), not
anything stored with the job.
"""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from ..options import ListenOptions
from .pool import Running


@dataclass(slots=True)
class Ack:
    """One acknowledgement to send: `op` is 'finish', 'retry' or 'fail'; `args` its ARGV group."""

    op: str
    base: str
    fail_base: str | None
    args: list[Any]
    alone: bool = False  # sent as its own FCALL (its group was refused: find the bad one)


def error_dict(name: str, message: str, kind: str) -> dict[str, str]:
    return {"name": name, "message": message, "kind": kind}


def finish(job: Running, base: str, pid: int, started: int) -> Ack:
    return Ack("finish", base, None, [job.id, job.token, pid, started])


#: a retry's run_at meaning "now" on the server's clock
NOW = "+0"


def after(seconds: float) -> str:
    """A retry's run_at `seconds` from now on the server's clock (the library adds it to its
    own TIME, so a supervisor whose clock is off does not shift its retries)."""
    return f"+{max(0, int(seconds * 1000))}"


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
) -> Ack:
    """Back to waiting at `run_at`: ms since the epoch, or after(seconds) / NOW."""
    return Ack("retry", base, None, [job.id, job.token, run_at, kind, pid, started, error_name])


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
    return Ack(
        "fail",
        base,
        fail_base,
        [job.id, job.token, fail_id, fail_data, pid, started, error["name"], error["kind"]],
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
) -> Ack:
    """The ack for a handler's result: `error` None on success, else the worker's description."""
    if error is None:
        return finish(job, base, pid, started)
    kind = error.get("kind")
    described = error_dict(str(error.get("name")), str(error.get("message")), "permanent")
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
        run_at = int(retry_at * 1000) if retry_at > now else NOW
    else:
        run_at = after(backoff_seconds(spec, job.retry_count))
    return retry(job, base, run_at, "retry", pid, started, str(error.get("name")))


def on_dequeue(job: Running, spec: ListenOptions, base: str, fail_base: str | None) -> Ack | None:
    """A job dequeued past its stall or timeout limit fails without running its handler."""
    if job.stall_count >= spec.max_stalls:
        message = f"job stalled {job.stall_count} times (max_stalls={spec.max_stalls})"
        return fail(job, base, fail_base, error_dict("StallError", message, "stall"), "", "")
    if job.timeout_count >= spec.max_timeouts:
        message = f"job timed out {job.timeout_count} times (max_timeouts={spec.max_timeouts})"
        return fail(job, base, fail_base, error_dict("TimeoutError", message, "stall"), "", "")
    return None


def ack_commands(
    client_id: str, acks: list[Ack], maxlens: dict[str, int]
) -> tuple[list[tuple], list[list[Ack]]]:
    """The FCALLs of `acks`, one per (op, queue, fail queue) group (an ack marked `alone` is
    its own group), and the acks of each; `maxlens` maps a base key to its events maxlen."""
    grouped: dict[tuple, list[Ack]] = defaultdict(list)
    for ack in acks:
        alone = id(ack) if ack.alone else None
        grouped[(ack.op, ack.base, ack.fail_base, alone)].append(ack)
    commands: list[tuple] = []
    groups = []
    for (op, base, fail_base, _), items in grouped.items():
        keys = [base] if fail_base is None else [base, fail_base]
        args: list[Any] = ["FCALL", f"queasy_{op}", len(keys), *keys, "", client_id]
        args.append(maxlens[base])
        for ack in items:
            args.extend(ack.args)
        commands.append(tuple(args))
        groups.append(items)
    return commands, groups
