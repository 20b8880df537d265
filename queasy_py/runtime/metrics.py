"""What /metrics reports, counted by the scheduling loop in plain ints and lists (no
prometheus_client here: runtime/prometheus.py reads these at scrape time).

The loop calls two methods per job, and only when metrics are on: `ran` when a worker's
result arrives (wait and run time into per-queue histograms: a bisect and two adds) and
`acked` once per acknowledged group of a round (job outcomes by queue). Workers replaced
(runtime/workers.py `replaced`) and Redis errors (runtime/outage.py, runtime/heartbeat.py
`errors`) are counted where they happen, always: they are rare.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping
from typing import Any

from .. import defaults
from ..errors import ConfigError
from ..store.library import Ack as AckCode
from .outcomes import Ack
from .pool import Running

#: the `outcome` label of queasy_jobs_total, by ack (a retry's by its kind)
OUTCOMES = ("finished", "failed", "retried", "timed_out", "stalled", "released")
RETRY_OUTCOME = {
    "retry": "retried",
    "timeout": "timed_out",
    "stall": "stalled",
    "release": "released",  # handed back at shutdown, not counted against the job
    "return": "released",  # a pushed job with no room for it: back to waiting
}
OP_OUTCOME = {"finish": "finished", "fail": "failed"}
#: the `reason` label of queasy_workers_replaced_total (runtime/workers.py `replaced`), each
#: served from 0: a series that first appears at 1 loses that increase to rate()
REPLACED_REASONS = ("timeout", "crash", "memory", "max_jobs", "start", "swept")


BUCKETS = defaults.METRICS_BUCKETS


class Histogram:
    """Counts per bucket of defaults.METRICS_BUCKETS (the last one +Inf), their sum."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0


class Tally:
    """The loop's counts for the queues it listens to (names), by name and by base key.
    `clock` is the heartbeat's ServerClock: its `offset` (server - this host, seconds) puts
    a job's run_at (server ms) on this host's clock."""

    def __init__(self, bases: Mapping[str, str], clock: Any) -> None:
        self.clock = clock
        self.jobs = {name: dict.fromkeys(OUTCOMES, 0) for name in bases}
        self.by_base = {base: self.jobs[name] for name, base in bases.items()}
        self.wait = {name: Histogram() for name in bases}
        self.run = {name: Histogram() for name in bases}
        self.both = {name: (self.wait[name], self.run[name]) for name in bases}

    def ran(self, job: Running, started_ms: int, now: float) -> None:
        """A result of `job`: its wait (start - run_at: a job is not due before its run_at,
        which dispatch sets to its enqueue time when no later one is asked for) and its run
        time (its result's arrival - start; the worker's clock is this host's). Per job, in
        the loop: two bisects and four adds."""
        wait_h, run_h = self.both[job.queue]
        started = started_ms / 1000.0
        wait = started - job.run_at / 1000.0 + self.clock.offset
        if wait < 0.0:
            wait = 0.0
        run = now - started
        if run < 0.0:
            run = 0.0
        wait_h.counts[bisect_left(BUCKETS, wait)] += 1
        wait_h.total += wait
        run_h.counts[bisect_left(BUCKETS, run)] += 1
        run_h.total += run

    def acked(self, group: list[Ack], codes: list[int]) -> None:
        """Redis accepted the acks of one group (one op, one queue): stale ones (this client
        had been swept) changed nothing and are not counted."""
        counts = self.by_base[group[0].base]
        op = group[0].op
        if op == "retry":
            for ack, code in zip(group, codes, strict=False):
                if code != AckCode.STALE:
                    counts[RETRY_OUTCOME.get(ack.args[3], "retried")] += 1
        else:
            counts[OP_OUTCOME[op]] += len(codes) - codes.count(AckCode.STALE)


def serve_metrics(
    tally: Tally,
    workers: Any,
    counts: Mapping[str, Callable[[], dict[str, int]]],
    errors: Callable[[], dict[str, int]],
    settings: Mapping[str, Any],
) -> Any:
    """Serve /metrics on settings metrics_host:metrics_port (runtime/prometheus.py, imported
    only now); ConfigError when prometheus-client is missing or the port cannot be had."""
    try:
        from . import prometheus
    except ImportError as exc:
        raise ConfigError(
            f"metrics_port needs prometheus-client ({exc}): pip install 'queasy_py[metrics]'"
        ) from None
    host, port = settings["metrics_host"], settings["metrics_port"]
    return prometheus.serve(tally, workers, counts, errors, host, port)
