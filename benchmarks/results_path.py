"""The supervisor's CPU per job on its result path, in-process and without the other
processes' noise: a worker's batch of results read (workers.py), its acks made, grouped into
the round's FCALL (outcomes.ack_commands) and packed as RedisPipe.send packs it.

    python benchmarks/results_path.py [--rounds 20000] [--batch 10] [--result]

Times with time.thread_time_ns (this thread's CPU; the load of the machine changes it far
less than a wall-clock rate). The workers' side (making the batch) is timed apart: it runs
in the workers, in parallel. Runs against the tree it is started from, or the one PYTHONPATH names
(an older tree, to compare). The min of the repeats is the figure least moved by the load.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, os.environ.get("PYTHONPATH") or str(Path(__file__).resolve().parent.parent))

import hiredis  # noqa: E402
import orjson  # noqa: E402

from queasy_py import Client  # noqa: E402
from queasy_py.runtime import outcomes  # noqa: E402
from queasy_py.runtime.frames import Pipe  # noqa: E402
from queasy_py.runtime.pool import Running, WorkerProc  # noqa: E402
from queasy_py.runtime.supervisor import Supervisor  # noqa: E402
from queasy_py.store.embedded import EmbeddedServer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--result", action="store_true", help="a queue that stores results")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with EmbeddedServer() as server:
        client = Client(server.url, workers=0, prefix="rp")
        client.queue("bench").listen(
            "benchmarks.peers.tasks.queasy_pass", size=1, store_results=args.result
        )
        sup = Supervisor(client)
        ours, theirs = socket.socketpair()
        proc = WorkerProc(process=SimpleNamespace(pid=4242), pipe=Pipe(ours), sentinel=-1)
        sup.workers.procs.append(proc)
        headers = sup.rounds.headers
        supervisor_ns, worker_ns, jobs = [], [], 0
        value = '{"ok": true, "text": "été\\r\\n"}' if args.result else None
        for _ in range(args.repeat):
            sup_ns = wrk_ns = 0
            for r in range(args.rounds):
                items = []
                for i in range(args.batch):
                    seq = r * args.batch + i + 1
                    job = Running(
                        seq,
                        "bench",
                        f"job{seq:012d}",
                        f"0123456789ab{seq:x}",
                        b"1",
                        1700000000000,
                        0,
                        0,
                        0,
                        1,
                        1e18,
                    )
                    proc.jobs[seq] = job
                    item = [seq, 1700000000123, None] + ([value] if value else [])
                    items.append(item)
                t0 = time.thread_time_ns()
                frame = orjson.dumps(items)  # as the worker's sender thread does
                t1 = time.thread_time_ns()
                sup.workers._handle_message(proc, orjson.loads(frame))
                commands, _ = outcomes.ack_commands("c1", sup.acks, headers)
                packed = b"".join([hiredis.pack_command(tuple(c)) for c in commands])
                sup.acks.clear()
                t2 = time.thread_time_ns()
                assert packed.startswith(b"*")
                wrk_ns += t1 - t0
                sup_ns += t2 - t1
            n = args.rounds * args.batch
            supervisor_ns.append(sup_ns / n)
            worker_ns.append(wrk_ns / n)
            jobs += n
        theirs.close()
        sup.workers.procs.clear()
        sup.wakeup.close()
        sup.rounds.pipe.close()
        sup.r.close()
        sup.events.close()
        client.close()
    fmt = ", ".join
    print(
        f"batch {args.batch}, "
        f"result {'stored' if args.result else 'not stored'}; load {os.getloadavg()[0]:.2f}"
    )
    print(
        f"  supervisor µs/job: {fmt(f'{x / 1000:.2f}' for x in supervisor_ns)} "
        f"(median {statistics.median(supervisor_ns) / 1000:.2f})"
    )
    print(
        f"  worker (batch) µs/job: {fmt(f'{x / 1000:.2f}' for x in worker_ns)} "
        f"(median {statistics.median(worker_ns) / 1000:.2f})"
    )


if __name__ == "__main__":
    main()
