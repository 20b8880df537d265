"""The README's performance charts (docs/peers-2-cores.svg, docs/scaling-16-cores.svg,
docs/ratio-runs.svg, docs/server-floor.svg), drawn
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
        "source": "RESULTS.md \"The server's floor and the runs' spread\" "
        "(2026-11-28 00:02-00:09 UTC): run.py --only queasy,dramatiq,huey,bullmq --repeat 3, "
        "2 worker processes each",
        # processed/s, medians of 3, counted from the start of the workers' processes
        "processed": {
            "queasy_py": 8_287,
            "dramatiq 2.2.1": 2_743,
            "huey 3.5.4": 2_809,
            "bullmq 3.4.4": 1_260,
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
    "ratios": {
        "source": 'RESULTS.md, each peer table since "Peer table on an equal footing" '
        "(run.py --only queasy,dramatiq,huey,bullmq --repeat 3, each library from its own venv)",
        # (when, library, queasy_py processed/s, the best peer's processed/s), medians of 3
        "runs": [
            ("11-26 16:43", "4.2.0", 13_426, 4_180),
            ("11-27 00:26", "4.2.1", 14_324, 4_185),
            ("11-27 08:28", "4.3.0", 14_658, 4_206),
            ("11-27 19:32", "5.0.0", 7_608, 2_871),
            ("11-27 21:39", "5.1.0", 11_320, 2_932),
            ("11-27 22:38", "5.1.0", 8_346, 3_459),
            ("11-28 00:02", "5.1.0", 8_287, 2_809),
        ],
    },
    "floor": {
        "source": "RESULTS.md \"The server's floor and the runs' spread\" (2026-11-28): "
        "benchmarks/layout5/cost.py --n 2000 --callgrind, library 5.1.0, valkey 8.1.8",
        # instructions per no-op job: dispatch (calls of 1,000), dequeue, finish
        "configs": [
            ("events on, 1,000 ends kept,\n10 jobs per call (as run)", 27_800, 42_000, 94_300),
            ("the same,\n50 jobs per call", 27_900, 30_900, 78_700),
            ("no events, no ends,\n10 jobs per call", 27_800, 41_700, 61_900),
            ("no events, no ends,\n50 jobs per call", 28_200, 30_200, 48_800),
        ],
        # 10 µs of one server core at 5.5k instructions per µs (RESULTS.md, "by C function")
        "budget": 55_000,
    },
}

COLORS = {"queasy_py": "#c0392b", "huey": "#2c7fb8", "dramatiq": "#7fbf7b", "bullmq": "#999999"}


def color(name: str) -> str:
    return next(c for key, c in COLORS.items() if name.startswith(key))


def save(f, ax, title: str, source: str, path: Path) -> Path:
    """The charts' common end: no top and right frame, the title, the source line, the SVG."""
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title(title, loc="left")
    f.text(0.01, 0.01, source, fontsize=6, color="#555555")
    f.tight_layout(rect=(0, 0.05, 1, 1))
    f.savefig(path, metadata={"Date": None})
    return path


def peers(plt, out: Path) -> Path:
    fig = FIGURES["peers"]
    names, values = list(fig["processed"]), list(fig["processed"].values())
    f, ax = plt.subplots(figsize=(7, 3.2))
    bars = ax.barh(names[::-1], values[::-1], color=[color(n) for n in names[::-1]])
    ax.bar_label(bars, labels=[f"{v:,}" for v in values[::-1]], padding=4)
    ax.set_xlabel("no-op jobs processed per second (2 cores, 2 worker processes)")
    ax.set_xlim(0, max(values) * 1.18)
    return save(
        f, ax, "queasy_py against its peers on 2 cores", fig["source"], out / "peers-2-cores.svg"
    )


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
    return save(
        f,
        ax,
        "How it scales: queasy_py nears its server's one-core ceiling",
        fig["source"],
        out / "scaling-16-cores.svg",
    )


def ratios(plt, out: Path) -> Path:
    fig = FIGURES["ratios"]
    runs = fig["runs"]
    f, ax = plt.subplots(figsize=(7, 3.2))
    xs = list(range(len(runs)))
    ys = [q / best for _, _, q, best in runs]
    ax.plot(xs, ys, marker="o", color=COLORS["queasy_py"], linewidth=1)
    for x, y in zip(xs, ys, strict=True):
        ax.annotate(
            f"{y:.2f}×", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7
        )
    ax.axhline(3.0, color="#555555", linestyle=":", linewidth=1)
    ax.text(len(runs) - 1.6, 3.08, "issue 14: 3× the best peer", fontsize=7)
    ax.set_xticks(xs, [f"{when}\n{lib}" for when, lib, _, _ in runs], fontsize=7)
    ax.set_ylim(0, 4.5)
    ax.set_ylabel("processed/s, queasy_py / best peer")
    return save(
        f,
        ax,
        "The 2-core ratio, run by run (date UTC, library)",
        fig["source"],
        out / "ratio-runs.svg",
    )


def floor(plt, out: Path) -> Path:
    fig = FIGURES["floor"]
    configs = fig["configs"][::-1]
    f, ax = plt.subplots(figsize=(7, 3.4))
    names = [c[0] for c in configs]
    left = [0] * len(configs)
    for k, (phase, shade) in enumerate(
        (("dispatch", "#f1b6ac"), ("dequeue", "#e06c5a"), ("finish", "#c0392b"))
    ):
        widths = [c[k + 1] / 1000 for c in configs]
        ax.barh(names, widths, left=left, color=shade, label=phase)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, total in enumerate(left):
        ax.text(total + 2, y, f"{total:.0f}k", va="center", fontsize=8)
    ax.axvline(fig["budget"] / 1000, color="#555555", linestyle=":", linewidth=1)
    ax.text(fig["budget"] / 1000 + 1, len(configs) - 0.45, "10 µs a job", fontsize=7)
    ax.set_xlabel("server instructions per no-op job (thousands)")
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(loc="lower right", frameon=False, fontsize=7)
    return save(
        f, ax, "A job's server cost and the 10 µs target", fig["source"], out / "server-floor.svg"
    )


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
    for draw in (peers, scaling, ratios, floor):
        print(draw(plt, out))


if __name__ == "__main__":
    main()
