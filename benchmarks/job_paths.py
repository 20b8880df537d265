"""The supervisor's CPU per job on a job's two Python paths, in-process, without the other
processes' noise: a dequeue reply's jobs built and sent to a worker in one frame
(checkouts.py, pool.py), then the worker's batch of results read (workers.py), their acks
made, grouped into the round's FCALL (outcomes.ack_commands) and packed as RedisPipe.send
packs it. The worker is this process's end of a socketpair.

    python benchmarks/job_paths.py [--rounds 2000] [--batch 10] [--repeat 15] [--result]

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
from queasy_py.runtime.pool import WorkerProc  # noqa: E402
from queasy_py.runtime.supervisor import Supervisor  # noqa: E402
from queasy_py.store.embedded import EmbeddedServer  # noqa: E402


def reply(first: int, batch: int) -> list:
    """A dequeue reply of `batch` jobs, as the library writes it (the 'rec' form of library
    5.1.0: id, token, record string)."""
    out: list = [0, b""]
    for seq in range(first, first + batch):
        record = b'1700000000000 1700000000000 0 0 0 0\t\t{"n": 1}'
        out += [b"job%012d" % seq, b"0123456789ab.%x" % seq, record]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--result", action="store_true", help="a queue that stores results")
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    with EmbeddedServer() as server:
        client = Client(server.url, workers=0, prefix="rp")
        client.queue("bench").listen(
            "benchmarks.peers.tasks.queasy_pass", size=1, store_results=args.result
        )
        sup = Supervisor(client)
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        proc = WorkerProc(process=SimpleNamespace(pid=4242), pipe=Pipe(ours), sentinel=-1)
        proc.ready = True
        sup.workers.procs.append(proc)
        state, checkouts = sup.states["bench"], sup.rounds.checkouts
        headers = sup.rounds.headers
        took, acked, worker = [], [], []
        value = '{"ok": true, "text": "été\\r\\n"}' if args.result else None
        for _ in range(args.repeat):
            take_ns = ack_ns = wrk_ns = 0
            for r in range(args.rounds):
                got = reply(r * args.batch, args.batch)
                procs = [proc] * args.batch  # their units reserved, as Rounds.send does
                t0 = time.thread_time_ns()
                batches: dict = {}
                checkouts.take(state, procs, got, time.time(), batches)
                checkouts.send(batches)
                t1 = time.thread_time_ns()
                while True:  # the worker's end: read what was sent (not timed)
                    try:
                        theirs.recv(1 << 20)
                    except BlockingIOError:
                        break
                items = [
                    [seq, 1700000000123, None] + ([value] if value else []) for seq in proc.jobs
                ]
                t2 = time.thread_time_ns()
                frame = orjson.dumps(items)  # as the worker's sender thread does
                t3 = time.thread_time_ns()
                sup.workers._handle_message(proc, orjson.loads(frame))
                commands, _ = outcomes.ack_commands("c1", sup.acks, headers)
                packed = b"".join([hiredis.pack_command(tuple(c)) for c in commands])
                sup.acks.clear()
                t4 = time.thread_time_ns()
                assert packed.startswith(b"*") and not proc.jobs
                take_ns += t1 - t0
                wrk_ns += t3 - t2
                ack_ns += t4 - t3
            n = args.rounds * args.batch
            took.append(take_ns / n)
            acked.append(ack_ns / n)
            worker.append(wrk_ns / n)
        theirs.close()
        sup.workers.procs.clear()
        sup.wakeup.close()
        sup.rounds.pipe.close()
        sup.r.close()
        sup.events.close()
        client.close()
    print(
        f"batch {args.batch}, result {'stored' if args.result else 'not stored'}; "
        f"load {os.getloadavg()[0]:.2f}; µs/job, min (median) of {args.repeat}"
    )
    for name, runs in (
        ("supervisor, a dequeue reply's jobs to the worker", took),
        ("supervisor, the worker's results to a packed finish", acked),
        ("worker, its batch of results encoded", worker),
    ):
        print(f"  {name}: {min(runs) / 1000:.2f} ({statistics.median(runs) / 1000:.2f})")


if __name__ == "__main__":
    main()
