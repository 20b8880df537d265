"""Start-up: how long from starting `queasy run` until its first job has run, by worker count.

    python benchmarks/startup.py [--workers 2,8] [--repeat 5]

For each worker count, --repeat times: a job is dispatched to an empty queue of a private
valkey-server, then `queasy run` is started (a TOML file naming a handler that writes the
time it ran into a file); the time from the start of the process to the handler's run is
the figure (interpreter start, imports, connecting, the workers' start and their imports
included). Medians and ranges are printed with the load average. The supervisor is stopped
with SIGTERM after each run (SIGKILL of its group after 30 s).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bytecode import compile_queasy  # noqa: E402
from firstjob import run_first_job  # noqa: E402

from queasy_py import Client  # noqa: E402
from queasy_py.store.embedded import EmbeddedServer  # noqa: E402

HANDLER = """
import time


def handle(data, job):
    with open(data["path"], "a") as f:
        f.write(f"{time.time()!r}\\n")
"""


def dispatch(url: str, prefix: str, data: dict) -> None:
    with Client(url, prefix=prefix) as client:
        client.queue("start").dispatch(data)


def first_job(url: str, workers: int, tmp: Path, n: int) -> float:
    """Seconds from starting `queasy run` to the handler's run of a job waiting already."""
    out = tmp / f"ran-{workers}-{n}.txt"
    # this checkout's queasy_py (not an installed one): `python -m queasy_py.cli`, as the
    # `queasy` console script runs it
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    entry = ["-m", "queasy_py.cli"]
    started, done, _ = run_first_job(
        url, f"startup{n}w{workers}", workers, tmp, out, entry, env, dispatch
    )
    return done - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", default="2,8", help="comma-separated worker counts")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    counts = [int(x) for x in args.workers.split(",")]
    compile_queasy()  # as installed: its bytecode written (benchmarks/bytecode.py)
    load = os.getloadavg()
    times: dict[int, list[float]] = {w: [] for w in counts}
    with EmbeddedServer() as server, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "startup_handler.py").write_text(HANDLER)
        for n in range(args.repeat):  # worker counts interleaved: the load hits each alike
            for w in counts:
                times[w].append(first_job(server.url, w, tmp, n))
    print(
        f"`queasy run` to its first job, {args.repeat} runs each, {os.cpu_count()} cores, "
        f"load average {' / '.join(f'{x:.2f}' for x in load)} at start:"
    )
    for w in counts:
        t = sorted(times[w])
        print(
            f"  {w:>3} workers: median {statistics.median(t):.3f} s "
            f"(min {t[0]:.3f}, max {t[-1]:.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
