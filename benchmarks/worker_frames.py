"""A worker's CPU per message: one worker process (queasy_py.runtime.worker, as the supervisor
starts it) fed messages of K no-op jobs over its socketpair by this script, one message at a
time (the next once the last one's results came back).

    python benchmarks/worker_frames.py [--jobs 1,5,10] [--messages 3000] [--perf] [--repo PATH]

Prints, per K, the worker's CPU (user + system, all its threads) per message and per job,
the result messages per message, and the wall time per round trip; with --perf, `perf stat`'s
context switches and futex calls per message of the worker (where the CPU went before the
worker ran a message's jobs in its reading thread: README, profile item 23). --repo runs
another checkout's queasy_py (before/after comparisons). No server is needed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import psutil

REPO = Path(__file__).resolve().parent.parent
HANDLER = "benchmarks.peers.tasks.queasy_pass"
WORKER = "import sys; from queasy_py.runtime.worker import run; run(sys.argv[1:])"
PERF_EVENTS = "task-clock,context-switches,syscalls:sys_enter_futex"
WARM = 200  # messages before the timed ones


def measure(repo: Path, k: int, messages: int, perf: bool) -> str:
    sys.path.insert(0, str(repo))
    from queasy_py.runtime.frames import Pipe, pack_jobs

    ours, theirs = socket.socketpair()
    ours.settimeout(30.0)
    env = dict(os.environ, PYTHONPATH=str(repo))
    handlers = orjson.dumps({"q": HANDLER}).decode()
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(theirs.fileno()), handlers],
        pass_fds=[theirs.fileno()],
        env=env,
        cwd=tempfile.gettempdir(),  # not the checkout: its queasy_py comes from `repo`
        start_new_session=True,
    )
    theirs.close()
    pipe = Pipe(ours)
    counter = None
    try:
        if pipe.recv_frame() != b'"ready"':
            raise RuntimeError("the worker did not start")
        seq = 0

        def round_trip() -> int:
            nonlocal seq
            heads = []
            for _ in range(k):
                seq += 1
                heads.append([seq, "q", f"j{seq}", 1_700_000_000_000, 0, 0, 0, "", 2])
            pipe.send_frame(pack_jobs(heads, [b"{}"] * k))
            got = replies = 0
            while got < k:
                got += len(orjson.loads(pipe.recv_frame()))
                replies += 1
            return replies

        for _ in range(WARM):
            round_trip()
        worker = psutil.Process(proc.pid)
        out = Path(tempfile.mkstemp(prefix="worker-frames-perf-")[1])
        if perf:
            cmd = ["perf", "stat", "-x", ",", "-e", PERF_EVENTS, "-p", str(proc.pid)]
            counter = subprocess.Popen(cmd, stderr=out.open("w"))
            time.sleep(0.3)  # attached
        c0, t0, replies = sum(worker.cpu_times()[:2]), time.perf_counter(), 0
        for _ in range(messages):
            replies += round_trip()
        c1, t1 = sum(worker.cpu_times()[:2]), time.perf_counter()
        line = (
            f"{k:3d} job(s) per message: worker CPU {1e6 * (c1 - c0) / messages:6.1f} µs per"
            f" message, {1e6 * (c1 - c0) / messages / k:5.1f} µs per job;"
            f" {replies / messages:.2f} result messages per message;"
            f" {1e6 * (t1 - t0) / messages:.0f} µs per round trip"
        )
        if counter is not None:
            counter.send_signal(signal.SIGINT)
            counter.wait(timeout=30)
            counter = None
            counts = {}
            for row in out.read_text().splitlines():
                cells = row.split(",")
                if len(cells) > 2 and re.match(r"^[\d.]+$", cells[0]):
                    counts[cells[2]] = float(cells[0])
            # the counters ran over the timed messages and about 0.3 s of idle before them
            line += "; per message: " + ", ".join(
                f"{name} {value / messages:.1f}"
                for name, value in counts.items()
                if name != "task-clock"
            )
        out.unlink()
        return line
    finally:
        if counter is not None:
            counter.kill()
        pipe.close()  # the worker exits when its pipe closes
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        sys.path.remove(str(repo))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", default="1,5,10", help="jobs per message, comma-separated")
    p.add_argument("--messages", type=int, default=3000, help="timed messages per size")
    p.add_argument("--perf", action="store_true", help="perf stat the worker's switches")
    p.add_argument("--repo", default=str(REPO), help="the checkout whose queasy_py runs")
    args = p.parse_args()
    sizes = [int(x) for x in args.jobs.split(",") if x.strip()]
    if not sizes or min(sizes) < 1 or args.messages < 1:
        p.error("--jobs takes positive integers, --messages at least 1")
    if args.perf and shutil.which("perf") is None:
        p.error("--perf needs perf (linux-perf) on PATH")
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"worker of {args.repo}, {os.cpu_count()} cores, load average {load} at start")
    for k in sizes:
        print(measure(Path(args.repo), k, args.messages, args.perf), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
