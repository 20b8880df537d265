"""The report's plots: one PNG of four panels (matplotlib, no display needed).

Throughput per queue over time, wait and run time percentiles per queue, outcomes per queue,
and the top errors.
"""

from __future__ import annotations

import io

from .report import QUANTILES, Report


def figure_png(report: Report, dpi: int = 100) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.dates import ConciseDateFormatter
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 9), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    (through, times), (outcomes, errors) = fig.subplots(2, 2)
    names = [q.queue for q in report.queues]

    for queue, points in sorted(report.throughput.items()):
        if points:
            through.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=queue)
    through.set_title(f"finished jobs per {report.bucket}")
    through.set_ylim(bottom=0)
    through.xaxis.set_major_formatter(ConciseDateFormatter(through.xaxis.get_major_locator()))
    if report.throughput:
        through.legend(fontsize="small")

    width = 0.8 / (2 * len(QUANTILES))
    for n, quantile in enumerate(QUANTILES):
        series = (
            ("wait", [q.wait[n] for q in report.queues]),
            ("run", [q.run[n] for q in report.queues]),
        )
        for m, (what, values) in enumerate(series):
            offset = (m * len(QUANTILES) + n) * width - 0.4 + width / 2
            shown = [(i + offset, v) for i, v in enumerate(values) if v is not None and v > 0]
            times.bar(
                [x for x, _ in shown],
                [v for _, v in shown],
                width,
                label=f"{what} p{quantile * 100:g}",
                color=("#4c72b0", "#dd8452")[m],
                alpha=(0.45, 0.7, 1.0)[n],
            )
    times.set_xticks(range(len(names)), names, rotation=30)
    times.set_yscale("log")
    times.set_ylabel("seconds (log)")
    times.set_title("wait and run time: p50 / p95 / p99")
    if names:
        times.legend(fontsize="small", ncols=2)

    bottom = [0] * len(names)
    for outcome in ("finished", "failed", "retried", "timed_out", "stalled", "cancelled"):
        counts = [q.outcomes.get(outcome, 0) for q in report.queues]
        if any(counts):
            outcomes.bar(names, counts, bottom=bottom, label=outcome)
            bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    outcomes.set_title("outcomes (failure rate = failed / (finished + failed))")
    outcomes.tick_params(axis="x", labelrotation=30)
    for i, q in enumerate(report.queues):
        if q.failure_rate is not None:
            outcomes.annotate(f"{q.failure_rate:.1%}", (i, bottom[i]), ha="center", va="bottom")
    if names:
        outcomes.legend(fontsize="small")

    labels = [f"{q}: {n}"[:50] for q, n, _, _ in report.top_errors][::-1]
    errors.barh(labels, [c for _, _, _, c in report.top_errors][::-1], color="#c44e52")
    errors.set_title("top errors")
    errors.tick_params(axis="y", labelsize="small")

    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()
