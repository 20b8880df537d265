"""What the dashboard shows, read through the public API: the queues and their counts, the
live supervisors, recent failures, schedules, and the outcome events of the last hour (a
bounded read of each stream's newest events). On a Redis Cluster with a primary down (killed
or frozen, not failed over yet) the overview shows what the other primaries answer and names
what it could not read (queasy_py/reach.py), as `queasy status` does."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .. import defaults
from ..client import Client
from ..errors import InvalidInput
from ..history import History
from ..job import JobInfo
from ..queue import Queue
from ..reach import Reach, Unreachable

#: failed jobs read per queue for the main page's recent failures, and how many it shows
FAILURES_PER_QUEUE = 10
FAILURES_SHOWN = 10


@dataclass
class Overview:
    """The main page's facts, read at `now` (epoch seconds, the server's clock)."""

    now: float
    counts: dict[str, dict[str, int]]
    supervisors: list[dict[str, Any]]
    failures: list[JobInfo]
    schedules: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)  # queues whose hour was cut short
    #: what a cluster's primaries that did not answer hid: Reach.summary() (empty: nothing)
    unreachable: dict[str, Any] = field(default_factory=dict)


class Reader:
    """The dashboard's reads of one client. Queue objects are made here only, so that a fail
    queue gets its owner's hash tag (`emails-fail` is `client.queue("emails").fail_queue()`)."""

    def __init__(self, client: Client, events_per_queue: int = defaults.DASHBOARD_EVENTS):
        self.client = client
        self.history = History(client)
        self.events_per_queue = events_per_queue
        self._chart_lock = threading.Lock()
        self._chart: tuple[float, list[dict[str, Any]], list[str]] | None = None

    def names(self, reach: Reach | None = None) -> list[str]:
        return (reach or Reach(self.client, partial=False)).queue_names()

    def queue(self, name: str, known: list[str] | None = None) -> Queue | None:
        """The queue `name` if it exists (client.queues()), else None (bad names too)."""
        names = self.names() if known is None else known
        if name not in names:
            return None
        suffix = defaults.FAIL_QUEUE_SUFFIX
        owner = name[: -len(suffix)] if name.endswith(suffix) else None
        try:
            if owner and owner in names:
                return self.client.queue(owner).fail_queue()
            return self.client.queue(name)
        except InvalidInput:
            return None

    def queues(self, reach: Reach | None = None) -> list[Queue]:
        names = self.names(reach)
        out = [self.queue(name, names) for name in names]
        return [q for q in out if q is not None]

    def server_now(self) -> float:
        """The server's clock (on a cluster, a primary's that answers)."""
        return Reach(self.client).server_time()

    def counts(self, queues: list[Queue], reach: Reach) -> dict[str, dict[str, int]]:
        """The counts of each queue whose primary answers (the others: reach.queues)."""
        out = {}
        for q in queues:
            got = reach.read(q.keys.base, q.counts)
            if isinstance(got, Unreachable):
                reach.queues[q.name] = got.node
            else:
                out[q.name] = got
        return out

    def failures(self, queues: list[Queue], reach: Reach) -> list[JobInfo]:
        """The newest failed jobs of all queues (each with its last error and traceback)."""
        found: list[JobInfo] = []
        for q in queues:
            page = reach.read(q.keys.base, lambda q=q: q.jobs("failed", limit=FAILURES_PER_QUEUE))
            if not isinstance(page, Unreachable):
                found.extend(page[0])
        found.sort(key=lambda j: j.ended_at or 0.0, reverse=True)
        return found[:FAILURES_SHOWN]

    def hour_events(
        self, queues: list[Queue], now: float, reach: Reach
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """The outcome events of the last hour, the newest `events_per_queue` of each queue,
        and the queues that had more (their chart starts later). Read at most once per
        DASHBOARD_REFRESH seconds, whoever asks."""
        with self._chart_lock:
            if self._chart is not None and now - self._chart[0] < defaults.DASHBOARD_REFRESH:
                return self._chart[1], self._chart[2]
            events: list[dict[str, Any]] = []
            truncated = []
            for q in queues:
                stream = self.history.stream(q.name, q.keys.tag)
                got = reach.read(
                    q.keys.base,
                    lambda s=stream: self.history.recent(
                        s, max(0.0, now - 3600), self.events_per_queue
                    ),
                )
                if isinstance(got, Unreachable):
                    continue
                if len(got) >= self.events_per_queue:
                    truncated.append(q.name)
                events.extend(got)
            self._chart = (now, events, truncated)
            return events, truncated

    def overview(self) -> Overview:
        reach = Reach(self.client)
        queues = self.queues(reach)
        now = reach.server_time()
        events, truncated = self.hour_events(queues, now, reach)
        view = Overview(
            now=now,
            counts=self.counts(queues, reach),
            supervisors=reach.supervisors(),
            failures=self.failures(queues, reach),
            schedules=reach.schedules(),
            events=events,
            truncated=truncated,
        )
        view.unreachable = {} if reach.complete else reach.summary()
        return view

    def status(self) -> dict[str, Any]:
        """What the page's script refreshes: counts per queue, supervisors, time."""
        reach = Reach(self.client)
        queues = self.queues(reach)
        sups = reach.supervisors()
        return {
            "now": time.time(),
            "counts": self.counts(queues, reach),
            "supervisors": len(sups),
            "workers": sum(len(s.get("workers") or []) for s in sups),
            "active": sum(len(s.get("jobs") or []) for s in sups),
        }
