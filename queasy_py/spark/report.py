"""The history report: what the archived outcome events say, per queue.

`compute(spark, path)` reads the archive (only its committed files) and returns a Report;
`summary(report)` is its terminal text and `html(report)` a page with the plots of
queasy_py/spark/plots.py embedded as PNGs. Definitions (README, "Spark"):

- an *attempt* is an event with a started_at (a handler ran: finished, failed, retried,
  timed out); its wait is started_at - run_at, its run time ended_at - started_at;
- *failure rate*: failed / (finished + failed), the jobs that ended for good;
- percentiles are exact (Spark's `percentile`, linear between the two nearest values);
- *throughput*: finished events per time bucket (a second, a minute, an hour or a day: the
  first that gives at most 120 buckets over the archive's span).
"""

from __future__ import annotations

import base64
import html as html_lib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .eventrows import SCHEMA

OUTCOMES = ("finished", "failed", "retried", "timed_out", "stalled", "released", "cancelled")
QUANTILES = (0.5, 0.95, 0.99)
BUCKETS = (("second", 1), ("minute", 60), ("hour", 3600), ("day", 86400))
MAX_BUCKETS = 120


@dataclass
class QueueStats:
    queue: str
    events: int
    outcomes: dict[str, int]
    failure_rate: float | None  # None: no job ended for good
    wait: tuple[float | None, ...]  # p50, p95, p99 seconds
    run: tuple[float | None, ...]
    first: datetime | None
    last: datetime | None


@dataclass
class Report:
    path: str
    queues: list[QueueStats]
    bucket: str  # 'second' | 'minute' | 'hour' | 'day'
    throughput: dict[str, list[tuple[datetime, int]]]  # queue -> (bucket start, finished)
    top_errors: list[tuple[str, str, str | None, int]]  # queue, error_name, message, count
    slowest: list[tuple[str, str, str, float, datetime | None]]  # queue, id, outcome, s, start
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def events(self) -> int:
        return sum(q.events for q in self.queues)


def load(spark: SparkSession, path: str) -> DataFrame:
    """The archive's committed events (Spark reads `<path>/_spark_metadata`), read with the
    source's schema: inferred, an archive of no events had none (an error) and the partition
    column `queue` of queues named '007' was the integer 7."""
    return spark.read.schema(SCHEMA).parquet(path)


def compute(spark: SparkSession, path: str, top: int = 10) -> Report:
    events = load(spark, path).cache()
    try:
        return _compute(events, path, top)
    finally:
        events.unpersist()


def _quantiles(column: str) -> Any:
    return F.percentile(F.col(column), F.array(*[F.lit(q) for q in QUANTILES]))


def _compute(events: DataFrame, path: str, top: int) -> Report:
    attempts = events.where(F.col("started_at").isNotNull())
    counts: dict[str, dict[str, int]] = {}
    for row in events.groupBy("queue", "outcome").count().collect():
        counts.setdefault(row["queue"], {})[row["outcome"]] = row["count"]
    spans = {
        row["queue"]: (row["first"], row["last"])
        for row in events.groupBy("queue")
        .agg(F.min("ended_at").alias("first"), F.max("ended_at").alias("last"))
        .collect()
    }
    times = {
        row["queue"]: (row["wait"], row["run"])
        for row in attempts.groupBy("queue")
        .agg(_quantiles("wait_seconds").alias("wait"), _quantiles("run_seconds").alias("run"))
        .collect()
    }
    none = (None,) * len(QUANTILES)
    queues = []
    for name in sorted(counts):
        outcomes = {o: counts[name].get(o, 0) for o in OUTCOMES}
        outcomes.update({o: n for o, n in counts[name].items() if o not in outcomes})
        ended = outcomes["finished"] + outcomes["failed"]
        wait, run = times.get(name, (None, None))
        queues.append(
            QueueStats(
                queue=name,
                events=sum(counts[name].values()),
                outcomes=outcomes,
                failure_rate=outcomes["failed"] / ended if ended else None,
                wait=tuple(wait) if wait else none,
                run=tuple(run) if run else none,
                first=spans[name][0],
                last=spans[name][1],
            )
        )
    bucket, seconds = _bucket(queues)
    finished = events.where(F.col("outcome") == "finished")
    start = F.timestamp_seconds(
        F.floor(F.unix_timestamp("ended_at") / seconds) * F.lit(seconds)
    ).alias("bucket")
    throughput: dict[str, list[tuple[datetime, int]]] = {}
    for row in finished.groupBy("queue", start).count().orderBy("queue", "bucket").collect():
        throughput.setdefault(row["queue"], []).append((row["bucket"], row["count"]))
    errors = (
        events.where(F.col("error_name").isNotNull())
        .groupBy("queue", "error_name", "error_message")
        .count()
        .orderBy(F.desc("count"), "queue", "error_name")
        .limit(top)
        .collect()
    )
    slowest = (
        attempts.orderBy(F.desc("run_seconds"), "queue", "id")
        .select("queue", "id", "outcome", "run_seconds", "started_at")
        .limit(top)
        .collect()
    )
    return Report(
        path=path,
        queues=queues,
        bucket=bucket,
        throughput=throughput,
        top_errors=[(r[0], r[1], r[2], r[3]) for r in errors],
        slowest=[(r[0], r[1], r[2], r[3], r[4]) for r in slowest],
    )


def _bucket(queues: list[QueueStats]) -> tuple[str, int]:
    firsts = [q.first for q in queues if q.first is not None]
    lasts = [q.last for q in queues if q.last is not None]
    span = (max(lasts) - min(firsts)).total_seconds() if firsts else 0.0
    for name, seconds in BUCKETS:
        if span / seconds <= MAX_BUCKETS:
            return name, seconds
    return BUCKETS[-1]


# ---------------------------------------------------------------- text


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.1f}ms"
    return f"{value:.2f}s"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def summary_rows(report: Report) -> list[list[str]]:
    head = ["queue", "events", "finished", "failed", "retried", "timed_out", "stalled",
            "failure", "wait p50/p95/p99", "run p50/p95/p99"]  # fmt: skip
    rows = [head]
    for q in report.queues:
        rows.append(
            [
                q.queue,
                str(q.events),
                *(str(q.outcomes[o]) for o in ("finished", "failed", "retried", "timed_out")),
                str(q.outcomes["stalled"]),
                _rate(q.failure_rate),
                " / ".join(_s(v) for v in q.wait),
                " / ".join(_s(v) for v in q.run),
            ]
        )
    return rows


def summary(report: Report) -> str:
    """The report as text for a terminal."""
    rows = summary_rows(report)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"{report.events} events in {report.path}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    if report.top_errors:
        lines.append("top errors:")
        for queue, name, message, count in report.top_errors:
            text = f"{name}: {message}" if message else name
            lines.append(f"  {count:>6}  {queue}  {text}"[:160])
    if report.slowest:
        lines.append("slowest attempts:")
        for queue, job_id, outcome, seconds, _ in report.slowest:
            lines.append(f"  {_s(seconds):>9}  {queue}  {job_id}  {outcome}")
    return "\n".join(lines)


# ---------------------------------------------------------------- HTML


def html(report: Report, png: bytes | None = None) -> str:
    """The report as one HTML page; `png`: the plots (plots.figure_png), embedded."""
    e = html_lib.escape

    def table(rows: list[list[str]]) -> str:
        head = "".join(f"<th>{e(c)}</th>" for c in rows[0])
        body = "".join(
            "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows[1:]
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>queasy history report</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
        "td:first-child,th:first-child{text-align:left}</style></head><body>",
        f"<h1>queasy history report</h1><p>{report.events} events in <code>{e(report.path)}"
        f"</code>; throughput per {report.bucket}.</p>",
    ]
    if png is not None:
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<img alt='plots' src='data:image/png;base64,{data}'>")
    parts += ["<h2>Queues</h2>", table(summary_rows(report))]
    if report.top_errors:
        rows = [["count", "queue", "error", "message"]]
        rows += [[str(c), q, n, m or ""] for q, n, m, c in report.top_errors]
        parts += ["<h2>Top errors</h2>", table(rows)]
    if report.slowest:
        rows = [["run time", "queue", "id", "outcome", "started"]]
        rows += [[_s(s), q, i, o, str(t)] for q, i, o, s, t in report.slowest]
        parts += ["<h2>Slowest attempts</h2>", table(rows)]
    parts.append("</body></html>")
    return "\n".join(parts)
