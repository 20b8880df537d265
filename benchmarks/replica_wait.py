"""What `WAIT 1 <ms>` after each dequeue would cost on a Redis Cluster with replicas.

    python benchmarks/replica_wait.py [--n 20000] [--batch 10] [--blocks 10]

The option weighed for issue 13 (README "Redis Cluster", failover): a supervisor that waits
for a replica to acknowledge a round's dequeue before it hands the jobs to workers, so a
primary killed after the dequeue cannot lose the lease. This measures that round trip
alone, without changing the supervisor: a local cluster of 3 primaries with a replica each
(tests/cluster_servers.py), --n jobs dispatched to one queue, then dequeued --batch at a time
the way a supervisor's round does (one pipelined FCALL per round on the queue's primary),
in alternating blocks without and with a WAIT after the FCALL in the same pipeline. Printed
per mode: the round's wall time (median, p99; depends on the load, which is printed), and
the CPU per job of the primary and of its replica (psutil: load-independent).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from cluster_servers import LocalCluster  # noqa: E402

from queasy_py import Client  # noqa: E402


def cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=10, help="jobs per dequeue (a round)")
    parser.add_argument("--blocks", type=int, default=10, help="alternating blocks per mode")
    args = parser.parse_args()
    cluster = LocalCluster(primaries=3, replicas=1).start()
    try:
        with Client(cluster.url, workers=0, prefix=f"rw-{uuid.uuid4().hex[:6]}") as client:
            q = client.queue("bench")
            for i in range(0, args.n, 1000):
                q.dispatch_many([{"data": k} for k in range(i, min(args.n, i + 1000))])
            base = q.keys.base
            port = cluster.owner(base)
            replica = next(
                p for p in cluster.ports if cluster.replication(p).get("master_port") == port
            )
            procs = {
                p: psutil.Process(cluster.procs[cluster.ports.index(p)].pid)
                for p in (port, replica)
            }
            r = cluster.node(port)
            per_block = args.n // (2 * args.blocks) // args.batch  # rounds per block
            times: dict[str, list[float]] = {"no WAIT": [], "WAIT 1 1000": []}
            used = {mode: {p: 0.0 for p in procs} for mode in times}
            jobs = dict.fromkeys(times, 0)
            acked: list[int] = []
            k = 0
            for _ in range(args.blocks):
                for mode in times:
                    before = {p: cpu(proc) for p, proc in procs.items()}
                    for _ in range(per_block):
                        k += 1
                        pipe = r.pipeline(transaction=False)
                        pipe.execute_command(
                            "FCALL", "queasy_dequeue", 1, base, "", "c1", f"n{k}", args.batch,
                            600000, 1000, 0,
                        )  # fmt: skip
                        if mode != "no WAIT":
                            pipe.execute_command("WAIT", 1, 1000)
                        began = time.perf_counter()
                        replies = pipe.execute()
                        times[mode].append(time.perf_counter() - began)
                        jobs[mode] += (len(replies[0]) - 2) // 8
                        if mode != "no WAIT":
                            acked.append(int(replies[1]))
                    for p, proc in procs.items():
                        used[mode][p] += cpu(proc) - before[p]
    finally:
        cluster.stop()
    print(
        f"{sum(jobs.values()):,} jobs dequeued {args.batch} per round; "
        f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print("| mode | round median µs | round p99 µs | primary CPU µs/job | replica CPU µs/job |")
    print("|---|---|---|---|---|")
    for mode, ts in times.items():
        ts = sorted(ts)
        n = max(1, jobs[mode])
        print(
            f"| {mode} | {statistics.median(ts) * 1e6:.0f} | {ts[int(len(ts) * 0.99)] * 1e6:.0f} "
            f"| {used[mode][port] * 1e6 / n:.1f} | {used[mode][replica] * 1e6 / n:.1f} |"
        )
    print(f"WAIT answered 1 replica in {sum(a >= 1 for a in acked)} of {len(acked)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
