"""The README's performance charts (docs/peers-2-cores.svg, docs/scaling-16-cores.svg), drawn
from measured figures: each chart's numbers are copied here from the run that produced them,
named in FIGURES with its section of benchmarks/RESULTS.md. A new run: update FIGURES (and
RESULTS.md), then redraw.

    python benchmarks/charts.py [--out docs]

Needs matplotlib (the `spark` extra installs it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FIGURES = {
    "peers": {
        "source": 'RESULTS.md "Peer table on library 4.3.0" (2026-11-27 08:28 UTC): '
        "run.py --only queasy,dramatiq,huey,bullmq --repeat 3, 2 worker processes each",
        # processed/s, medians of 3, counted from the start of the workers' processes
        "processed": {
            "queasy_py": 14_658,
            "dramatiq 2.2.1": 4_029,
            "huey 3.5.4": 4_206,
            "bullmq 3.4.4": 2_119,
        },
    },
    "scaling": {
        "source": 'RESULTS.md "Many cores: a 16-core machine" (2026-11-26 23:43 UTC): '
        "run.py --workers N, 40,000 pre-queued no-op jobs, one valkey-server",
        "workers": [2, 8, 14],
        "jobs_per_s": {
            "queasy_py (1 supervisor)": [17_906, 22_862, 25_621],
            "huey 3.5.4": [8_190, 27_137, 29_899],
            "dramatiq 2.2.1": [4_048, 14_782, 24_584],
        },
    },
}

COLORS = {"queasy_py": "#c0392b", "huey": "#2c7fb8", "dramatiq": "#7fbf7b", "bullmq": "#999999"}


def color(name: str) -> str:
    return next(c for key, c in COLORS.items() if name.startswith(key))


def peers(plt, out: Path) -> Path:
    fig = FIGURES["peers"]
    names, values = list(fig["processed"]), list(fig["processed"].values())
    f, ax = plt.subplots(figsize=(7, 3.2))
    bars = ax.barh(names[::-1], values[::-1], color=[color(n) for n in names[::-1]])
    ax.bar_label(bars, labels=[f"{v:,}" for v in values[::-1]], padding=4)
    ax.set_xlabel("no-op jobs processed per second (2 cores, 2 worker processes)")
    ax.set_xlim(0, max(values) * 1.18)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title("queasy_py against its peers on 2 cores", loc="left")
    f.text(0.01, 0.01, fig["source"], fontsize=6, color="#555555")
    f.tight_layout(rect=(0, 0.05, 1, 1))
    path = out / "peers-2-cores.svg"
    f.savefig(path, metadata={"Date": None})
    return path


def scaling(plt, out: Path) -> Path:
    fig = FIGURES["scaling"]
    f, ax = plt.subplots(figsize=(7, 3.6))
    for name, rates in fig["jobs_per_s"].items():
        ax.plot(fig["workers"], rates, marker="o", label=name, color=color(name))
    ax.set_xticks(fig["workers"])
    ax.set_xlabel("worker processes (16-core machine, one Redis server)")
    ax.set_ylabel("jobs per second")
    ax.set_ylim(0, 35_000)
    ax.axhline(28_000, color="#c0392b", linestyle=":", linewidth=1)
    ax.text(2.1, 28_600, "queasy_py's ceiling: one server core at ~35 µs a job", fontsize=7)
    ax.legend(loc="lower right", frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title("How it scales: queasy_py nears its server's one-core ceiling", loc="left")
    f.text(0.01, 0.01, fig["source"], fontsize=6, color="#555555")
    f.tight_layout(rect=(0, 0.05, 1, 1))
    path = out / "scaling-16-cores.svg"
    f.savefig(path, metadata={"Date": None})
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs"))
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "queasy_py"  # the same SVG for the same figures
    import matplotlib.pyplot as plt

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for draw in (peers, scaling):
        print(draw(plt, out))


if __name__ == "__main__":
    main()
