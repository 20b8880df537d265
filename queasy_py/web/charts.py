"""The last hour from the outcome events: jobs per minute (finished, failed, retried) and
latency (wait and run time, p50 and p95), as inline SVG drawn by the server (no script, no
asset from elsewhere). Colours come from the page's stylesheet (classes only)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import Any

MINUTES = 60
WIDTH, HEIGHT = 760, 170
LEFT, RIGHT, TOP, BOTTOM = 48, 8, 10, 22
#: the outcomes counted as throughput, and those whose run time and wait are measured
COUNTED = ("finished", "failed", "retried")
TIMED = ("finished", "failed", "retried", "timed_out")
SERIES = ("wait_p50", "wait_p95", "run_p50", "run_p95")


@dataclass
class Bucket:
    finished: int = 0
    failed: int = 0
    retried: int = 0  # retried and timed out
    waits: list[float] = field(default_factory=list)
    runs: list[float] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.finished + self.failed + self.retried


def percentile(values: list[float], p: float) -> float | None:
    """The nearest-rank percentile `p` (0..100) of `values`; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def _ms(value: Any) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


def buckets(events: list[dict[str, Any]], now: float) -> list[Bucket]:
    """Per-minute buckets of the hour before `now` (epoch seconds), oldest first."""
    out = [Bucket() for _ in range(MINUTES)]
    start_ms = (now - MINUTES * 60) * 1000
    for event in events:
        ended = _ms(event.get("ended_at"))
        if ended is None or ended < start_ms:
            continue
        index = min(MINUTES - 1, int((ended - start_ms) // 60_000))
        bucket, outcome = out[index], event.get("outcome")
        if outcome == "finished":
            bucket.finished += 1
        elif outcome == "failed":
            bucket.failed += 1
        elif outcome in ("retried", "timed_out"):
            bucket.retried += 1
        started = _ms(event.get("started_at"))
        if outcome in TIMED and started is not None:
            bucket.runs.append(max(0, ended - started) / 1000)
            due = max(_ms(event.get("enqueued_at")) or 0, _ms(event.get("run_at")) or 0)
            if due:
                bucket.waits.append(max(0, started - due) / 1000)
    return out


def summary(rows: list[Bucket]) -> dict[str, Any]:
    """The hour's totals and latency percentiles."""
    waits = [w for b in rows for w in b.waits]
    runs = [r for b in rows for r in b.runs]
    return {
        "finished": sum(b.finished for b in rows),
        "failed": sum(b.failed for b in rows),
        "retried": sum(b.retried for b in rows),
        "wait_p50": percentile(waits, 50),
        "wait_p95": percentile(waits, 95),
        "run_p50": percentile(runs, 50),
        "run_p95": percentile(runs, 95),
    }


def nice_max(value: float) -> float:
    """A round axis top at or above `value` (1, 2, 5 times a power of ten)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power  # pragma: no cover - the loop always returns


def seconds_text(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.2f} s"
    return f"{value / 60:.1f} min"


def _frame(kind: str, top: float, unit: str, attrs: str) -> list[str]:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [
        f'<svg class="chart" id="{kind}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" xmlns="http://www.w3.org/2000/svg" {attrs}>',
        f'<rect class="plot" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/>',
    ]
    for frac in (0, 0.5, 1):
        y = TOP + plot_h * (1 - frac)
        label = f"{top * frac:g}" if unit == "jobs" else seconds_text(top * frac)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y}" y2="{y}"/>')
        parts.append(f'<text class="axis" x="{LEFT - 4}" y="{y + 4}" text-anchor="end">'
                     f"{escape(label)}</text>")  # fmt: skip
    for minutes_ago in (60, 45, 30, 15, 0):
        x = LEFT + plot_w * (MINUTES - minutes_ago) / MINUTES
        label = "now" if minutes_ago == 0 else f"-{minutes_ago} min"
        anchor = "end" if minutes_ago == 0 else "start" if minutes_ago == 60 else "middle"
        parts.append(f'<text class="axis" x="{x}" y="{HEIGHT - 6}" text-anchor="{anchor}">'
                     f"{label}</text>")  # fmt: skip
    return parts


def throughput_svg(rows: list[Bucket]) -> str:
    """Stacked bars per minute: finished, failed, retried."""
    total = summary(rows)
    top = nice_max(max((b.total for b in rows), default=0))
    attrs = (
        f'data-finished="{total["finished"]}" data-failed="{total["failed"]}" '
        f'data-retried="{total["retried"]}" aria-label="jobs per minute, last hour"'
    )
    parts = _frame("throughput", top, "jobs", attrs)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    width = plot_w / MINUTES
    for i, b in enumerate(rows):
        if not b.total:
            continue
        x, y = LEFT + i * width, TOP + plot_h
        parts.append("<g>")
        parts.append(f"<title>-{MINUTES - i} min: {b.finished} finished, {b.failed} failed, "
                     f"{b.retried} retried</title>")  # fmt: skip
        for name, value in (("finished", b.finished), ("failed", b.failed),
                            ("retried", b.retried)):  # fmt: skip
            if value:
                h = plot_h * value / top
                y -= h
                parts.append(f'<rect class="bar {name}" x="{x + 0.5:.1f}" y="{y:.1f}" '
                             f'width="{max(1.0, width - 1):.1f}" height="{h:.1f}"/>')  # fmt: skip
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def latency_svg(rows: list[Bucket]) -> str:
    """Lines per minute: wait and run time, p50 and p95."""
    values = {
        "wait_p50": [percentile(b.waits, 50) for b in rows],
        "wait_p95": [percentile(b.waits, 95) for b in rows],
        "run_p50": [percentile(b.runs, 50) for b in rows],
        "run_p95": [percentile(b.runs, 95) for b in rows],
    }
    top = nice_max(max((v for vs in values.values() for v in vs if v is not None), default=0))
    parts = _frame("latency", top, "s", 'aria-label="wait and run time, last hour"')
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    width = plot_w / MINUTES
    for name in SERIES:
        points = []
        for i, v in enumerate(values[name]):
            if v is None:
                continue
            x, y = LEFT + (i + 0.5) * width, TOP + plot_h * (1 - v / top)
            points.append(f"{x:.1f},{y:.1f}")
            parts.append(f'<circle class="dot {name}" cx="{x:.1f}" cy="{y:.1f}" r="2">'
                         f"<title>-{MINUTES - i} min: {name.replace('_', ' ')} "
                         f"{seconds_text(v)}</title></circle>")  # fmt: skip
        if len(points) > 1:
            parts.append(f'<polyline class="line {name}" points="{" ".join(points)}"/>')
    parts.append("</svg>")
    return "".join(parts)


def charts_html(events: list[dict[str, Any]], now: float) -> str:
    """Both charts with their legends and the hour's summary line."""
    rows = buckets(events, now)
    s = summary(rows)
    legend_t = "".join(f'<span class="key {n}">{n}</span>' for n in ("finished", "failed",
                                                                      "retried"))  # fmt: skip
    legend_l = "".join(f'<span class="key {n}">{n.replace("_", " ")}</span>' for n in SERIES)
    return (
        f'<p class="summary">Last hour: <b id="hour-finished">{s["finished"]}</b> finished, '
        f'<b id="hour-failed">{s["failed"]}</b> failed, {s["retried"]} retried; wait p50 '
        f"{seconds_text(s['wait_p50'])}, p95 {seconds_text(s['wait_p95'])}; run p50 "
        f"{seconds_text(s['run_p50'])}, p95 {seconds_text(s['run_p95'])}</p>"
        f'<div class="charts"><div><h3>Jobs per minute</h3><div class="legend">{legend_t}</div>'
        f'{throughput_svg(rows)}</div><div><h3>Latency</h3><div class="legend">{legend_l}</div>'
        f"{latency_svg(rows)}</div></div>"
    )
