"""Prometheus /metrics of one supervisor (settings `metrics_port`, `metrics_host`).

A collector of its own registry reads, at scrape time, what the loop counted in plain ints
(runtime/metrics.py `Tally`, workers' `replaced`, the outage and heartbeat `errors`), the
workers and units as the loop holds them, and each queue's jobs per state with one
`Queue.counts()` call per queue (not per job). The loop itself never touches
prometheus_client. Imported by the supervisor only when metrics are on (the `metrics` extra).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import redis
from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .. import defaults
from ..errors import ConfigError, ConnectionFailed
from .metrics import REPLACED_REASONS, Histogram, Tally
from .scrapes import ScrapeServer, bind, bind_problem

if TYPE_CHECKING:
    from .workers import Workers

log = logging.getLogger("queasy_py")

#: the jobs-per-state gauge's states, as Queue.counts() names them
STATES = ("waiting", "delayed", "blocked", "active")


class QueasyCollector(Collector):
    """Every queasy_* metric of one supervisor, read when scraped."""

    def __init__(
        self,
        tally: Tally,
        workers: Workers,
        counts: Mapping[str, Callable[[], dict[str, int]]],
        errors: Callable[[], dict[str, int]],
    ) -> None:
        self.tally = tally
        self.workers = workers
        self.counts = counts  # queue name -> its Queue.counts
        self.errors = errors  # Redis errors by source (loop, heartbeat)
        self.scrape_errors = 0

    def collect(self) -> Iterator[Metric]:
        tally = self.tally
        jobs = CounterMetricFamily(
            "queasy_jobs",
            "Jobs acknowledged by this supervisor, by queue and outcome "
            "(finished, failed, retried, timed_out, stalled, released)",
            labels=["queue", "outcome"],
        )
        for queue, outcomes in tally.jobs.items():
            for outcome, n in list(outcomes.items()):
                jobs.add_metric([queue, outcome], n)
        yield jobs
        yield _histogram(
            "queasy_job_wait_seconds",
            "Seconds from a job's run_at (its dispatch, or the later time asked for) to its start",
            tally.wait,
        )
        yield _histogram(
            "queasy_job_run_seconds", "Seconds a job's handler ran (start to result)", tally.run
        )
        yield from self._workers()
        yield from self._states()
        errors = CounterMetricFamily(
            "queasy_redis_errors",
            "Failed Redis round trips of this supervisor, by source (loop, heartbeat, scrape)",
            labels=["source"],
        )
        for source, n in {**self.errors(), "scrape": self.scrape_errors}.items():
            errors.add_metric([source], n)
        yield errors

    def _workers(self) -> Iterator[Metric]:
        procs = list(self.workers.procs)
        accepting = [p for p in procs if p.accepts]
        yield GaugeMetricFamily("queasy_workers", "Worker processes alive", value=len(procs))
        yield GaugeMetricFamily(
            "queasy_capacity_units",
            "Capacity units of the workers taking jobs",
            value=defaults.WORKER_UNITS * len(accepting),
        )
        yield GaugeMetricFamily(
            "queasy_capacity_units_free",
            "Capacity units free on the workers taking jobs",
            value=sum(max(0, p.idle_units) for p in accepting),
        )
        replaced = CounterMetricFamily(
            "queasy_workers_replaced",
            "Workers replaced, by reason (timeout, crash, memory, max_jobs, start, swept)",
            labels=["reason"],
        )
        counted = dict(self.workers.replaced)  # a copy: the loop adds to it
        for reason in dict.fromkeys([*REPLACED_REASONS, *counted]):
            replaced.add_metric([reason], counted.get(reason, 0))
        yield replaced

    def _states(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "queasy_queue_jobs",
            "Jobs of a queue per state (waiting, delayed, blocked, active), read from Redis "
            "at scrape time (absent for queues not read within METRICS_COUNTS_BUDGET)",
            labels=["queue", "state"],
        )
        deadline = time.monotonic() + defaults.METRICS_COUNTS_BUDGET
        for queue, counts in self.counts.items():
            if time.monotonic() > deadline:  # a slow or frozen server: the rest next time
                log.debug("metrics: counts of %s not read: the scrape's budget is spent", queue)
                continue
            try:
                now = counts()
            except (redis.RedisError, OSError, ConnectionFailed) as exc:  # Queue.counts'
                self.scrape_errors += 1
                log.debug("metrics: counts of %s not read: %s", queue, exc)
                continue
            for state in STATES:
                gauge.add_metric([queue, state], now.get(state, 0))
        yield gauge


def _histogram(name: str, doc: str, hists: Mapping[str, Histogram]) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=["queue"])
    bounds = [floatToGoString(b) for b in defaults.METRICS_BUCKETS] + ["+Inf"]
    for queue, hist in hists.items():
        counts, total = list(hist.counts), hist.total
        cumulative, buckets = 0, []
        for bound, n in zip(bounds, counts, strict=True):
            cumulative += n
            buckets.append((bound, cumulative))
        family.add_metric([queue], buckets, total)
    return family


class MetricsServer:
    """/metrics over HTTP from threads of the supervisor's process (runtime/scrapes.py: a
    fixed number of them, whatever its clients do)."""

    def __init__(self, collector: QueasyCollector, host: str, port: int) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        ProcessCollector(registry=self.registry)  # the supervisor's CPU, memory, fds
        self.host = host
        self.server: ScrapeServer | None = None
        try:
            sock = bind(host, port)
        except OSError as exc:
            raise ConfigError(bind_problem(exc, host, port)) from None
        self.server = ScrapeServer(make_wsgi_app(self.registry), sock)
        self.port: int = self.server.port
        log.info("metrics on http://%s:%d/metrics", _url_host(host), self.port)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def serve(
    tally: Tally,
    workers: Workers,
    counts: Mapping[str, Callable[[], dict[str, int]]],
    errors: Callable[[], dict[str, int]],
    host: str,
    port: int,
) -> MetricsServer:
    """Serve /metrics on host:port (0: a free port, logged); ConfigError when it cannot."""
    return MetricsServer(QueasyCollector(tally, workers, counts, errors), host, port)
