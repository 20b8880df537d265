"""`queasy status`: the queues' counts, the live supervisors and the schedules at a glance.

On a Redis Cluster with a primary down (killed or frozen, not failed over yet) it shows what
the other primaries answer: each queue of the down primary as unreachable (naming it), the
supervisors and queue names when the registry's primaries answer, the schedules of the
primaries that answer; then exits PARTIAL (7). A single server that is down is CONNECT (3)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..client import Client
from ..reach import Reach, Unreachable
from . import exitcodes, show
from .operate import locate

HEADERS = ("QUEUE", "WAITING", "DELAYED", "BLOCKED", "ACTIVE", "DONE/1m", "FAILED/1m",
           "DONE/1h", "FAILED/1h", "DONE", "FAILED")  # fmt: skip
COLUMNS = ("waiting", "delayed", "blocked", "active", "finished_last_minute",
           "failed_last_minute", "finished_last_hour", "failed_last_hour", "finished",
           "failed")  # fmt: skip


def status(args: argparse.Namespace, client: Client) -> int:
    reach = Reach(client)
    supervisors = reach.supervisors()
    names = set(reach.queue_names())
    for entry in supervisors:
        names.update(q for q in entry.get("queues") or () if isinstance(q, str))
    queues = []
    for name in sorted(names):
        queue = locate(client, name, names, reach)
        counts = reach.read(queue.keys.base, queue.counts)
        if isinstance(counts, Unreachable):
            reach.queues[name] = counts.node
            queues.append({"queue": name, "unreachable": counts.node})
        else:
            queues.append({"queue": name, **counts})
    schedules = reach.schedules()
    now = time.time()
    if args.json:
        show.json_line(
            {
                "queues": queues,
                "supervisors": [{**s, "uptime": _uptime(s, now)} for s in supervisors],
                "schedules": [
                    {**_schedule(info), "next_fire_at": info.next_fire_at}
                    for info in schedules.values()
                ],
                "unreachable": reach.summary(),
            }
        )
    else:
        _text(queues, supervisors, schedules, now)
        _missing(reach)
    return exitcodes.OK if reach.complete else exitcodes.PARTIAL


def _text(
    queues: list[dict[str, Any]], supervisors: list[dict[str, Any]], schedules: Any, now: float
) -> None:
    lost = any("unreachable" in q for q in queues)  # a column naming each one's primary
    rows = [
        (q["queue"], *(q[k] for k in COLUMNS), *([""] if lost else []))
        if "unreachable" not in q
        else (q["queue"], *["-"] * len(COLUMNS), f"unreachable: {q['unreachable']}")
        for q in queues
    ]
    headers = (*HEADERS, "PRIMARY") if lost else HEADERS
    show.out(show.table(headers, rows) if queues else "no queues")
    show.out()
    show.out(
        show.table(
            ("HOST", "PID", "UPTIME", "WORKERS", "FREE/UNITS", "RUNNING", "QUEUES"),
            [
                (
                    s.get("host", "?"),
                    s.get("pid", "?"),
                    show.span(_uptime(s, now)),
                    len(s.get("workers") or ()),
                    f"{s.get('free_units', 0)}/{s.get('units', 0)}",
                    len(s.get("jobs") or ()),
                    ", ".join(s.get("queues") or ()),
                )
                for s in supervisors
            ],
        )  # fmt: skip
        if supervisors
        else "no live supervisor"
    )
    if schedules:
        show.out()
        show.out(
            show.table(
                ("SCHEDULE", "SPEC", "NEXT FIRE", "STATE", "LAST OUTCOME", "SKIPPED"),
                [
                    (
                        i.queue,
                        i.spec,
                        show.when(i.next_fire_at),
                        i.state or "-",
                        i.last_outcome or "-",
                        i.skipped,
                    )
                    for i in schedules.values()
                ],
            )  # fmt: skip
        )


def _missing(reach: Reach) -> None:
    """One line per primary that did not answer: what was not read because of it."""
    for down in reach.down.values():
        queues = [name for name, node in reach.queues.items() if node == down.node]
        parts = [part for part, nodes in reach.parts.items() if down.node in nodes]
        what = ([f"queues {', '.join(queues)}"] if queues else []) + parts
        show.out()
        show.out(
            f"PARTIAL: Redis Cluster primary {down.node} does not answer ({down.error}); "
            f"not read: {'; '.join(what) or 'nothing listed here'}"
        )


def _uptime(entry: dict[str, Any], now: float) -> float | None:
    started = entry.get("started_at")
    return max(0.0, now - started) if isinstance(started, int | float) else None


def _schedule(info: Any) -> dict[str, Any]:
    fields = ("queue", "spec", "fire_at", "state", "last_fire_at", "last_outcome",
              "last_ended_at", "skipped")  # fmt: skip
    return {name: getattr(info, name) for name in fields}
