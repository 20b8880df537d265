"""The dashboard's HTML: the layout every page shares and the main page (queues, charts,
supervisors, recent failures, schedules). Every value from Redis is escaped here; links to a
queue or a job quote its name."""

from __future__ import annotations

import time
from html import escape
from typing import Any
from urllib.parse import quote

from ..job import JobInfo
from ..records import COUNTS
from .charts import charts_html
from .data import Overview

#: the counts columns of the queues table: (key of counts(), header)
COLUMNS = (
    ("waiting", "waiting"),
    ("delayed", "delayed"),
    ("blocked", "blocked"),
    ("active", "active"),
    ("finished", "finished"),
    ("failed", "failed"),
    ("finished_last_minute", "finished / min"),
    ("failed_last_minute", "failed / min"),
    ("finished_last_hour", "finished / h"),
    ("failed_last_hour", "failed / h"),
)
assert {key for key, _ in COLUMNS} == set(COUNTS)


def e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def when(epoch: float | None) -> str:
    """An epoch time as UTC text ('–' when unknown)."""
    if not epoch:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1000):03d}"


def ago(now: float, epoch: float | None) -> str:
    if not epoch:
        return "–"
    delta = now - epoch
    if abs(delta) < 120:
        return f"{delta:.0f} s ago" if delta >= 0 else f"in {-delta:.0f} s"
    if abs(delta) < 7200:
        return f"{delta / 60:.0f} min ago" if delta >= 0 else f"in {-delta / 60:.0f} min"
    return f"{delta / 3600:.1f} h ago" if delta >= 0 else f"in {-delta / 3600:.1f} h"


def queue_url(name: str) -> str:
    return f"/queues/{quote(name, safe='')}"


def job_url(queue: str, job_id: str) -> str:
    return f"{queue_url(queue)}/jobs/{quote(job_id, safe='')}"


def layout(title: str, body: str, *, server: str, read_only: bool, refresh: float = 0) -> str:
    badge = '<span class="badge">read-only</span>' if read_only else ""
    data = f' data-refresh="{refresh:g}"' if refresh else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)} · queasy</title>"
        '<link rel="stylesheet" href="/static/app.css"></head>'
        f'<body{data}><header><a class=brand href="/">queasy</a> {badge}'
        f'<span class="server">{e(server)}</span></header><main>{body}</main>'
        '<script src="/static/app.js"></script></body></html>'
    )


def counts_row(name: str, counts: dict[str, int]) -> str:
    cells = "".join(
        f'<td class=num data-q="{e(name)}" data-k="{key}">{counts.get(key, 0)}</td>'
        for key, _ in COLUMNS
    )
    return f'<tr><th><a href="{e(queue_url(name))}">{e(name)}</a></th>{cells}</tr>'


def queues_table(counts: dict[str, dict[str, int]]) -> str:
    if not counts:
        return '<p class="empty">No queues yet: dispatch a job or start a supervisor.</p>'
    head = "".join(f"<th class=num>{e(label)}</th>" for _, label in COLUMNS)
    rows = "".join(counts_row(name, c) for name, c in counts.items())
    return f'<table id="queues"><thead><tr><th>queue</th>{head}</tr></thead>{rows}</table>'


def supervisors_table(sups: list[dict[str, Any]], now: float) -> str:
    if not sups:
        return '<p class="empty" id="no-supervisors">No live supervisor.</p>'
    rows = []
    for s in sups:
        jobs = s.get("jobs") or []
        running = "".join(
            f'<li><a href="{e(job_url(str(j.get("queue")), str(j.get("id"))))}">'
            f"{e(j.get('queue'))} / {e(j.get('id'))}</a> on {e(j.get('worker_pid'))}, "
            f"started {ago(now, j.get('started_at'))}"
            f"{' <b class=bad>timed out</b>' if j.get('timed_out') else ''}</li>"
            for j in jobs
        )
        workers = s.get("workers") or []
        state = " <b class=bad>stopping</b>" if s.get("stopping") else ""
        rows.append(
            f"<tr><td>{e(s.get('host'))}</td><td class=num>{e(s.get('pid'))}</td>"
            f"<td>{ago(now, s.get('started_at'))}</td>"
            f"<td>{e(', '.join(map(str, s.get('queues') or [])))}</td>"
            f"<td>{len(workers)} <small>({e(', '.join(map(str, workers)))})</small></td>"
            f"<td class=num>{e(s.get('free_units'))} / {e(s.get('units'))}</td>"
            f"<td><ul class=plain>{running or '<li>idle</li>'}</ul></td>"
            f"<td>{ago(now, s.get('beat_at'))}{state}</td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("host", "pid", "started", "queues", "workers", "free units", "running", "beat")
    )
    return f'<table id="supervisors"><thead><tr>{head}</tr></thead>{"".join(rows)}</table>'


def error_block(error: dict[str, Any] | None, open_: bool = False) -> str:
    if not error:
        return "–"
    head = f"<b>{e(error.get('name'))}</b>: {e(error.get('message'))}"
    trace = error.get("traceback")
    if not trace:
        return head
    flag = " open" if open_ else ""
    return f"{head}<details{flag}><summary>traceback</summary><pre>{e(trace)}</pre></details>"


def failures_table(failures: list[JobInfo], now: float) -> str:
    if not failures:
        return '<p class="empty">No failed job kept.</p>'
    rows = "".join(
        f"<tr><td>{ago(now, j.ended_at)}</td><td>{e(j.queue)}</td>"
        f'<td><a href="{e(job_url(j.queue, j.id))}">{e(j.id)}</a></td>'
        f"<td class=num>{j.attempts}</td><td class=error>{error_block(j.last_error)}</td></tr>"
        for j in failures
    )
    head = "<tr><th>failed</th><th>queue</th><th>job</th><th>attempts</th><th>error</th></tr>"
    return f'<table id="failures"><thead>{head}</thead>{rows}</table>'


def schedules_table(schedules: dict[str, Any], now: float) -> str:
    if not schedules:
        return '<p class="empty">No schedule.</p>'
    rows = "".join(
        f'<tr><td><a href="{e(queue_url(name))}">{e(name)}</a></td><td><code>{e(s.spec)}'
        f"</code></td><td>{e(s.state or '–')}</td><td>{when(s.next_fire_at)} "
        f"<small>{ago(now, s.next_fire_at)}</small></td><td>{e(s.last_outcome or '–')}</td>"
        f"<td>{when(s.last_fire_at)}</td><td class=num>{s.skipped}</td></tr>"
        for name, s in schedules.items()
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "queue",
            "schedule",
            "state",
            "next fire (UTC)",
            "last outcome",
            "last fire",
            "skipped",
        )  # fmt: skip
    )
    return f'<table id="schedules"><thead><tr>{head}</tr></thead>{rows}</table>'


def main_page(view: Overview) -> str:
    cut = ""
    if view.truncated:
        names = e(", ".join(view.truncated))
        cut = (
            f'<p class="note">The chart holds the newest events only of {names} '
            "(more than the read bound in the hour).</p>"
        )
    return (
        f"{unreachable_note(view.unreachable)}<h1>Queues</h1>{queues_table(view.counts)}"
        f'<h2>Last hour</h2><div id="charts">{charts_html(view.events, view.now)}</div>{cut}'
        f"<h2>Supervisors</h2>{supervisors_table(view.supervisors, view.now)}"
        f"<h2>Recent failures</h2>{failures_table(view.failures, view.now)}"
        f"<h2>Schedules</h2>{schedules_table(view.schedules, view.now)}"
    )


def unreachable_note(summary: dict[str, Any]) -> str:
    """What a Redis Cluster's primaries that did not answer hid (Reach.summary()): one line
    per primary, its queues and the parts not read."""
    lines = []
    for down in summary.get("nodes", ()):
        node = down["node"]
        queues = [name for name, at in summary["queues"].items() if at == node]
        parts = [part for part, nodes in summary["parts"].items() if node in nodes]
        what = ([f"queues {', '.join(queues)}"] if queues else []) + parts
        lines.append(
            f'<p class="note unreachable" data-node="{e(node)}">Redis Cluster primary '
            f"{e(node)} does not answer ({e(down['error'])}); not shown: "
            f"{e('; '.join(what) or 'nothing')}</p>"
        )
    return "".join(lines)


def message_page(title: str, text: str) -> str:
    return f'<h1>{e(title)}</h1><p class="message">{e(text)}</p><p><a href="/">Back</a></p>'
