"""How the operator commands print: times, durations, tables, one line per job or event,
and JSON (one object, or one object per line) for scripts."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

import orjson

from ..job import JobInfo

#: characters of an error message a table or an event line shows (inspect shows it whole)
MESSAGE = 80


def when(seconds: float | None) -> str:
    """Epoch seconds as local time to the millisecond; '-' for None."""
    if seconds is None:
        return "-"
    whole = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))
    return f"{whole}.{int(seconds * 1000) % 1000:03d}"


def span(seconds: float | None) -> str:
    """A duration: 850ms, 12.3s, 4m05s, 2h03m, 3d04h; '-' for None."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def short(text: str, limit: int = MESSAGE) -> str:
    """One line of at most `limit` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def error_line(error: dict[str, Any] | None) -> str:
    if not error or not error.get("name"):
        return ""
    return short(f"{error['name']}: {error.get('message') or ''}".rstrip(": "))


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned text columns, numbers right-aligned, two spaces apart."""
    cells = [list(headers)] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [
        all(r[i].isdigit() for r in cells[1:]) and len(cells) > 1 for i in range(len(widths))
    ]
    lines = []
    for row in cells:
        parts = [
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(row, widths, numeric, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


#: control characters a terminal acts on (escape sequences, a carriage return, a bell),
#: shown as \xNN: an error message or traceback a job raised may carry them from its data
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))}


def printable(text: str) -> str:
    """`text` with its control characters but newlines and tabs escaped."""
    return text.translate(_CONTROL)


def out(text: str = "") -> None:
    print(printable(text), flush=True)


def json_line(value: Any) -> None:
    """One JSON value on one line of stdout."""
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode() + "\n")
    sys.stdout.flush()


def job_dict(job: JobInfo) -> dict[str, Any]:
    return asdict(job)


def job_time(job: JobInfo) -> float | None:
    """The time a listing shows: when it runs (waiting, delayed, blocked), started (active),
    ended (an end)."""
    if job.state == "active":
        return job.started_at
    if job.ended_at is not None:
        return job.ended_at
    return job.run_at


def job_row(job: JobInfo) -> list[str]:
    return [
        job.state,
        job.id,
        when(job_time(job)),
        str(job.attempts),
        str(job.retry_count),
        error_line(job.last_error),
    ]


JOB_HEADERS = ("STATE", "ID", "TIME", "ATTEMPTS", "RETRIES", "LAST ERROR")


def inspect_text(job: JobInfo) -> str:
    """Every field of a job's record, its last error with its traceback."""
    shown = {
        "id": job.id,
        "queue": job.queue,
        "state": job.state,
        "data": orjson.dumps(job.data).decode(),
        "run_at": when(job.run_at),
        "enqueued_at": when(job.enqueued_at),
        "started_at": when(job.started_at),
        "ended_at": when(job.ended_at),
        "attempts": job.attempts,
        "retry_count": job.retry_count,
        "stall_count": job.stall_count,
        "timeout_count": job.timeout_count,
        "worker_pid": job.worker_pid if job.worker_pid is not None else "-",
        "client": job.client or "-",
        "host": job.host or "-",
        "result": orjson.dumps(job.result).decode() if job.state == "finished" else "-",
    }
    width = max(len(k) for k in shown) + 2
    lines = [f"{key.ljust(width)}{value}" for key, value in shown.items()]
    error = job.last_error
    if not error:
        lines.append(f"{'last_error'.ljust(width)}-")
        return "\n".join(lines)
    lines.append(f"{'last_error'.ljust(width)}{error['name']}: {error.get('message') or ''}")
    lines.append(f"{'  kind'.ljust(width)}{error.get('kind') or '-'}")
    lines.append(f"{'  at'.ljust(width)}{when(error.get('at'))}")
    trace = error.get("traceback")
    lines.append(f"{'  traceback'.ljust(width)}{'-' if not trace else ''}".rstrip())
    if trace:
        lines.extend("    " + line for line in trace.rstrip("\n").splitlines())
    return "\n".join(lines)


def _ms(value: int | None) -> float | None:
    return None if value is None else value / 1000.0


def event_line(event: dict[str, Any]) -> str:
    """One outcome event on one line: time, outcome, job id, and what it says."""
    ended, started = _ms(event.get("ended_at")), _ms(event.get("started_at"))
    parts = [when(ended), f"{event.get('outcome', '?'):<9}", str(event.get("id", "?"))]
    if started is not None and ended is not None:
        parts.append(f"ran {span(ended - started)}")
    enqueued, run_at = _ms(event.get("enqueued_at")), _ms(event.get("run_at"))
    due = max(t for t in (enqueued, run_at) if t is not None) if (enqueued or run_at) else None
    if started is not None and due is not None:
        parts.append(f"waited {span(max(0.0, started - due))}")
    counts = [
        f"{name} {event[key]}"
        for name, key in (("retry", "retry_count"), ("stall", "stall_count"),
                          ("timeout", "timeout_count"))
        if event.get(key)
    ]  # fmt: skip
    parts.extend(counts)
    if event.get("pid"):
        parts.append(f"pid {event['pid']}")
    error = error_line({"name": event.get("error_name"), "message": event.get("error_message")})
    if error:
        parts.append(f"- {error}")
    return "  ".join(parts)
