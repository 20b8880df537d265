"""Profile the hot path: N no-op jobs through one supervisor with 2 workers.

    python benchmarks/profile.py [--n 40000] [--size 10] [--cprofile] [--metrics] [--syscalls]

Prints the throughput and the CPU seconds each process used (supervisor, each worker, the
server), and the server's own time in the queasy functions (INFO commandstats: usec of
FCALL), which shows where a job's cost goes; with --cprofile the supervisor runs under
cProfile and its top functions are printed (by wall time; with PROFILE_CLOCK=cpu by
the supervisor's CPU time, so waits are left out); with --metrics the supervisor serves Prometheus
/metrics (metrics_port), scraped once a second during the run; with --syscalls `strace -c -f`
counts the supervisor's system calls per job while the jobs run (a count, not a time: it does
not depend on the load; strace slows the run, so its jobs/s and CPU are not comparable then).
It starts its own valkey-server.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from queasy_py import Client  # noqa: E402
from queasy_py.store.embedded import EmbeddedServer, free_port  # noqa: E402

SUPERVISOR = textwrap.dedent(
    """
    import cProfile, os, pstats, sys, time
    from queasy_py import Client
    url, size, profile = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    port = int(sys.argv[4]) if len(sys.argv) > 4 else None
    client = Client(url, workers=2, prefix="prof", metrics_port=port)
    client.queue("bench").listen("benchmarks.peers.tasks.queasy_pass", size=size)
    if os.environ.get("PROFILE_SAMPLE"):  # CPU-time samples of the loop's function and line
        import collections, signal
        samples = collections.Counter()
        def sample(signum, frame):
            samples[(frame.f_code.co_filename.rsplit("/", 2)[-1], frame.f_code.co_name,
                     frame.f_lineno)] += 1
            seen, f = set(), frame
            while f is not None:  # every function on the stack: inclusive counts
                seen.add(("in", f.f_code.co_filename.rsplit("/", 1)[-1], f.f_code.co_name))
                f = f.f_back
            for k in seen:
                samples[k] += 1
        signal.signal(signal.SIGPROF, sample)
        signal.setitimer(signal.ITIMER_PROF, 0.0005, 0.0005)
        def report():
            total = sum(v for k, v in samples.items() if k[0] != "in")
            print(f"{total} samples", file=sys.stderr)
            for k, v in samples.most_common(int(os.environ.get("PROFILE_TOP", "40"))):
                print(f"{v:6d} {100 * v / total:5.1f}% {k}", file=sys.stderr)
        import atexit
        atexit.register(report)
    if profile:
        # PROFILE_CLOCK=cpu: the supervisor's CPU time (time.process_time), not wall time,
        # so time spent waiting in select() or on a loaded machine is left out
        cpu_clock = os.environ.get("PROFILE_CLOCK") == "cpu"
        prof = cProfile.Profile(time.process_time) if cpu_clock else cProfile.Profile()
        prof.enable()
    try:
        client.run()
    finally:
        if profile:
            prof.disable()
            stats = pstats.Stats(prof).sort_stats(os.environ.get("PROFILE_SORT", "tottime"))
            stats.print_stats(int(os.environ.get("PROFILE_TOP", "20")))
    """
)


#: the states of jobs not ended yet (counts() also has totals of ended ones)
LIVE = ("waiting", "delayed", "blocked", "active")


def cpu(proc: psutil.Process) -> float:
    try:
        times = proc.cpu_times()
        return times.user + times.system
    except psutil.Error:
        return 0.0


def fcall_time(client: Client) -> int:
    """The server's usec in FCALL so far (INFO commandstats; FCALL_RO, this script's counts
    polling, left out)."""
    return int(client.redis.info("commandstats").get("cmdstat_fcall", {}).get("usec", 0))


#: commands this script and the clients send themselves (the rest run inside FCALLs)
NOT_INNER = {"fcall_ro", "info", "ping", "hello", "client|setinfo", "sadd", "function|load"}


def command_calls(client: Client) -> dict[str, int]:
    """Calls of each command so far (INFO commandstats)."""
    stats = client.redis.info("commandstats")
    return {k[len("cmdstat_") :]: int(v["calls"]) for k, v in stats.items()}


def strace_counts(path: str) -> dict[str, int]:
    """The calls of each system call in the summary `strace -c -o path` wrote."""
    out = {}
    for line in Path(path).read_text().splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
        if m and m.group(2) != "total":
            out[m.group(2)] = int(m.group(1))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=40000)
    parser.add_argument("--size", type=int, default=10)
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--metrics", action="store_true", help="serve and scrape /metrics")
    parser.add_argument(
        "--syscalls", action="store_true", help="count the supervisor's system calls (strace)"
    )
    parser.add_argument(
        "--calls", action="store_true", help="also print the commands the library ran per job"
    )
    args = parser.parse_args()
    with EmbeddedServer() as server, Client(server.url, prefix="prof") as client:
        q = client.queue("bench")
        q.dispatch_many([{"data": i} for i in range(args.n)])
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        port = free_port()
        sup = subprocess.Popen(
            [
                sys.executable,
                "-c",
                SUPERVISOR,
                server.url,
                str(args.size),
                "1" if args.cprofile else "0",
                *([str(port)] if args.metrics else []),
            ],
            env=env,
            cwd=REPO,
            start_new_session=True,
        )
        try:
            parent, srv = psutil.Process(sup.pid), psutil.Process(server.pid)
            deadline = time.monotonic() + 600
            while q.counts()["waiting"] == args.n and time.monotonic() < deadline:
                time.sleep(0.005)
            tracer, trace_out = None, f"/tmp/queasy-profile-strace-{os.getpid()}.txt"
            if args.syscalls:
                if shutil.which("strace") is None:
                    parser.error("--syscalls needs strace")
                tracer = subprocess.Popen(
                    ["strace", "-c", "-f", "-o", trace_out, "-p", str(sup.pid)],
                    stderr=subprocess.DEVNULL,
                )
            start = time.perf_counter()
            base = {p.pid: cpu(p) for p in [parent, srv, *parent.children()]}
            fcall_usec = fcall_time(client)
            calls = command_calls(client)
            next_scrape, scrapes = time.monotonic() + 1.0, 0
            while sum(q.counts()[k] for k in LIVE) and time.monotonic() < deadline:
                time.sleep(0.05)
                if args.metrics and time.monotonic() >= next_scrape:
                    next_scrape += 1.0
                    url = f"http://127.0.0.1:{port}/metrics"
                    with urllib.request.urlopen(url, timeout=10) as reply:
                        reply.read()
                    scrapes += 1
            elapsed = time.perf_counter() - start
            if tracer is not None:
                tracer.send_signal(signal.SIGINT)
                tracer.wait(timeout=60)
            procs = [("supervisor", parent), ("server", srv)]
            procs += [(f"worker {p.pid}", p) for p in parent.children()]
            print(
                f"{args.n} no-op jobs, size {args.size}, 2 workers: "
                f"{args.n / elapsed:,.0f} jobs/s ({elapsed:.2f} s)"
                + (f", metrics on ({scrapes} scrapes)" if args.metrics else "")
            )
            for name, proc in procs:
                used = cpu(proc) - base.get(proc.pid, 0.0)
                print(f"  {name:>14}: {used:.2f} CPU s, {used / args.n * 1e6:.1f} us/job")
            usec = fcall_time(client) - fcall_usec
            print(f"  {'server FCALL':>14}: {usec / 1e6:.2f} s, {usec / args.n:.1f} us/job")
            ran = {k: v - calls.get(k, 0) for k, v in command_calls(client).items()}
            fcalls = ran.pop("fcall", 0)
            inner = {k: v for k, v in ran.items() if k not in NOT_INNER}
            print(
                f"  {'server calls':>14}: {fcalls / args.n:.2f} FCALL and "
                f"{sum(inner.values()) / args.n:.2f} commands inside them per job"
            )
            if tracer is not None:
                counts = strace_counts(trace_out)
                os.unlink(trace_out)
                total = sum(counts.values())
                print(f"  {'supervisor':>14}: {total / args.n:.3f} system calls per job (strace)")
                for name, count in sorted(counts.items(), key=lambda kv: -kv[1]):
                    print(f"  {name:>14}: {count / args.n:.3f}")
            if args.calls:
                for name, count in sorted(inner.items(), key=lambda kv: -kv[1]):
                    print(f"  {name:>14}: {count / args.n:.2f}")
        finally:
            os.killpg(sup.pid, signal.SIGTERM)
            sup.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
