"""`queasy status|jobs|inspect|requeue|purge|events`: what an operator asks of the server
`queasy run` uses (issue #11). Each reads through the public API (Client, Queue) and the
store's event reader; every call is bounded (pages of at most 1000 jobs). Each takes
`--json` for scripts; an unknown queue or job id exits NOT_FOUND (6)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ..client import Client
from ..defaults import FAIL_QUEUE_SUFFIX, SCHEDULE_ID
from ..errors import ConfigError, JobNotFound, QueasyError
from ..handlers import dead_letter
from ..operate import LISTED, PAGE, PURGED
from ..queue import Queue
from ..reach import Reach, Unreachable
from ..store import events
from . import exitcodes, show

#: the order `queasy jobs` lists states in without --state
JOB_ORDER = ("active", "waiting", "delayed", "blocked", "failed", "finished", "cancelled")


class QueueNotFound(QueasyError, LookupError):
    """`queasy`: no queue of that name is known to the server."""


def add_parsers(
    sub: argparse._SubParsersAction,
    common: argparse.ArgumentParser,
    server_options: Callable[..., None],
) -> None:
    """The subcommands, with main.py's --log-level (`common`) and server options."""

    def command(name: str, help: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, parents=[common], help=help)
        server_options(parser, config=True)
        parser.add_argument("--json", action="store_true", help="JSON output for scripts")
        return parser

    command("status", "queues, live supervisors and schedules at a glance")
    jobs = command("jobs", "list a queue's jobs by state")
    jobs.add_argument("queue")
    jobs.add_argument("--state", choices=(*LISTED, "all"), default="all")
    jobs.add_argument("--limit", type=int, default=100, help="most jobs listed (default 100)")
    jobs.add_argument("--data", action="store_true", help="include each job's data")
    inspect = command("inspect", "every field of one job, its last error and traceback")
    inspect.add_argument("queue")
    inspect.add_argument("id")
    requeue = command("requeue", "dispatch failed jobs again (kept records, dead letters)")
    requeue.add_argument("queue")
    requeue.add_argument(
        "--failed", action="store_true", help="the failed jobs (required: what to requeue)"
    )
    requeue.add_argument(
        "--id", action="append", dest="ids", metavar="ID", help="only this job (repeat)"
    )
    purge = command("purge", "remove a queue's jobs of a state (never active ones)")
    purge.add_argument("queue")
    purge.add_argument("--state", choices=(*PURGED, "all"), default="all")
    purge.add_argument("--yes", action="store_true", help="confirm: without it nothing goes")
    tail = command("events", "the queue's outcome events, newest last")
    tail.add_argument("queue")
    tail.add_argument("--limit", type=int, default=20, help="past events shown (default 20)")
    tail.add_argument("--follow", "-f", action="store_true", help="then wait for new ones")


def run(args: argparse.Namespace, connect: Callable[[argparse.Namespace], Client]) -> int:
    """Run the operator command `args.command` on the client `connect(args)` makes."""
    check(args)
    with connect(args) as client:
        return COMMANDS[args.command](args, client)


def check(args: argparse.Namespace) -> None:
    """Refuse a command line that cannot be right before connecting (ConfigError: exit 2)."""
    if args.command == "purge" and not args.yes:
        raise ConfigError(
            f"queasy purge removes {args.state} jobs of {args.queue} for good: add --yes "
            "to confirm (nothing was removed)"
        )
    if args.command == "requeue" and not args.failed:
        raise ConfigError(
            "say what to requeue: --failed (its kept failed records and dead letters)"
        )
    limit = getattr(args, "limit", None)
    low = 0 if args.command == "events" else 1
    high = events.MAX_COUNT if args.command == "events" else 1_000_000
    if limit is not None and not low <= limit <= high:
        raise ConfigError(f"--limit must be {low}..{high}, not {limit}")


# ---------------------------------------------------------------- which queue


def served(client: Client) -> tuple[list[dict[str, Any]], set[str]]:
    """The live supervisors and every queue name the server knows of: dispatched to,
    listened on (the registry), or served by a live supervisor."""
    supervisors = client.supervisors()
    names = set(client.queues())
    for entry in supervisors:
        names.update(q for q in entry.get("queues") or () if isinstance(q, str))
    return supervisors, names


def locate(
    client: Client, name: str, known: set[str] | None = None, reach: Reach | None = None
) -> Queue:
    """The queue `name` with its hash tag: a fail queue (`X-fail`) shares X's. QueueNotFound
    unless the store has keys of it (jobs, records, events, totals, leases, a schedule,
    dead letters) or knows its name (`known`, default `served()`'s). With `reach`, a
    candidate whose primary does not answer is passed over (queasy status)."""
    owner = name[: -len(FAIL_QUEUE_SUFFIX)] if name.endswith(FAIL_QUEUE_SUFFIX) else ""
    candidates = [Queue(client, name, tag) for tag in ((owner, name) if owner else (name,))]
    for queue in candidates:
        call = lambda q=queue: client.redis.exists(*q.keys.traces)  # noqa: E731
        found = call() if reach is None else reach.read(queue.keys.base, call)
        if found and not isinstance(found, Unreachable):
            return queue
    if name in (served(client)[1] if known is None else known):
        return candidates[0]
    raise QueueNotFound(
        f"unknown queue {name!r}: it has no jobs, records, events or dead letters and no "
        "supervisor listens on it (queasy status lists the queues)"
    )


# ---------------------------------------------------------------- the commands


def cmd_status(args: argparse.Namespace, client: Client) -> int:
    from .status import status  # its own module: the tables, and a cluster's missing parts

    return status(args, client)


def cmd_jobs(args: argparse.Namespace, client: Client) -> int:
    queue = locate(client, args.queue)
    states = JOB_ORDER if args.state == "all" else (args.state,)
    rows = []
    for state in states:
        cursor = "0"
        while len(rows) < args.limit:  # cursor-based pages of at most PAGE jobs each
            left = args.limit - len(rows)
            page, cursor = queue.jobs(state, cursor, min(PAGE, left), with_data=args.data)
            for job in page[:left]:
                if args.json:
                    show.json_line(show.job_dict(job))
                rows.append(show.job_row(job))
            if cursor == "0":
                break
    if not args.json:
        show.out(show.table(show.JOB_HEADERS, rows) if rows else f"no {args.state} jobs")
    return exitcodes.OK


def cmd_inspect(args: argparse.Namespace, client: Client) -> int:
    queue = locate(client, args.queue)
    job = queue.get_job(args.id)
    if job is None:
        raise JobNotFound(
            f"no job {args.id!r} in queue {queue.name!r} (never dispatched, or its record is "
            "no longer kept: see keep_finished and keep_failed)"
        )
    if args.json:
        show.json_line(show.job_dict(job))
    else:
        show.out(show.inspect_text(job))
    return exitcodes.OK


def cmd_requeue(args: argparse.Namespace, client: Client) -> int:
    queue = locate(client, args.queue)
    # the dead letters there before the records are requeued: a job requeued from its
    # record that a running supervisor fails again meanwhile gets a new letter, which is
    # not this command's to requeue (it would run the job a third time)
    entries = dead_letter.pending(queue)
    if args.ids is None:
        from_records, requeued = queue.requeue_failed(), set()
    else:
        if SCHEDULE_ID in args.ids:  # refused before any id is requeued
            queue._refuse_schedule([args.ids], queue.schedule_info() is not None)
        requeued = {job_id for job_id in dict.fromkeys(args.ids) if queue.requeue_failed([job_id])}
        from_records = len(requeued)
    letters = dead_letter.requeue(queue, args.ids, entries)
    missing = [i for i in dict.fromkeys(args.ids or ()) if i not in requeued | set(letters)]
    total = from_records + len(letters)
    if args.json:
        show.json_line(
            {"queue": queue.name, "requeued": total, "records": from_records,
             "dead_letters": len(letters), "not_found": missing}
        )  # fmt: skip
    else:
        show.out(
            f"requeued {total} failed job{'' if total == 1 else 's'} of {queue.name} "
            f"({from_records} from kept failed records, {len(letters)} from dead letters)"
        )
    if missing:
        raise JobNotFound(
            f"no failed record or dead letter to requeue in {queue.name} for "
            f"{', '.join(map(repr, missing))} (unknown, no longer kept, or live again)"
        )
    return exitcodes.OK


def cmd_purge(args: argparse.Namespace, client: Client) -> int:
    queue = locate(client, args.queue)
    states = PURGED if args.state == "all" else (args.state,)
    removed = {state: queue.purge(state) for state in states}
    total = sum(removed.values())
    active = queue.counts()["active"]
    if args.json:
        show.json_line(
            {"queue": queue.name, "removed": total, "by_state": removed, "active": active}
        )
        return exitcodes.OK
    detail = ", ".join(f"{n} {state}" for state, n in removed.items() if n) or "none"
    show.out(
        f"removed {total} job{'' if total == 1 else 's'} of {queue.name} ({detail}); "
        f"active jobs are never purged: {active} active"
    )
    return exitcodes.OK


def cmd_events(args: argparse.Namespace, client: Client) -> int:
    queue = locate(client, args.queue)
    r, key = client.redis, queue.keys.events
    past = events.recent(r, key, 0, args.limit) if args.limit else []
    for event in past:
        _event(args, event)
    if not args.follow:
        if not past and not args.json:
            show.out(f"no events of {queue.name}")
        return exitcodes.OK
    after = past[-1]["event_id"] if past else events.last_id(r, key)
    while True:  # until Ctrl-C: main() exits INTERRUPTED (130)
        for event in events.follow(r, key, after, PAGE, events.read_block(r, events.EVENT_BLOCK)):
            _event(args, event)
            after = event["event_id"]


def _event(args: argparse.Namespace, event: dict[str, Any]) -> None:
    if args.json:
        show.json_line(event)
    else:
        show.out(show.event_line(event))


COMMANDS: dict[str, Callable[[argparse.Namespace, Client], int]] = {
    "status": cmd_status,
    "jobs": cmd_jobs,
    "inspect": cmd_inspect,
    "requeue": cmd_requeue,
    "purge": cmd_purge,
    "events": cmd_events,
}
#: the commands of this module (main.py registers them)
NAMES = tuple(COMMANDS)
