"""Where a job's server time goes: the library's functions one at a time, per command.

    python benchmarks/server_cost.py [--n 20000] [--batch 10] [--maxlen 100000] [--keep 1000]
                                     [--callgrind] [--reply rec|wide]

Starts its own valkey-server (the embedded one), then runs N no-op jobs through the library
the way a supervisor does, one phase at a time: `dispatch_many` (calls of 1,000), dequeue
(`--batch` jobs per FCALL, one client; with the reply 'rec', id, token and record per job, as
the supervisor asks since library 5.1.0, or with `--reply wide` the 8 values per job of
earlier libraries) and finish (`--batch` acks per FCALL, events and
records kept as by default). Then, each into a queue of its own, N jobs of the Spark sink
benchmark's shape (id user-<i>, data {user_id, email, n}) by `dispatch_many` and by
`dispatch_once` (`dispatch_batch(dedup_window=86400)`: the sink's path with an id column),
calls of 1,000. For each phase it prints, per job: the server's time in FCALL (INFO
commandstats usec), the server process's CPU, and each command the library ran inside (calls
and usec per job). FCALL usec minus the inner commands' usec is the Lua side: the
interpreter, the conversion of arguments and replies between Lua and the server, the calls'
own overhead. Only this script talks to the server, so the figures are the library's alone.
A Markdown table is printed at the end.

With --callgrind the server runs under `valgrind --tool=callgrind` (about 50 times slower: use
a smaller --n, such as 2000) and the table gets the instructions the server executed per job
in each phase: a count that does not depend on the machine's load, to compare two versions
of the library exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import redis

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from queasy_py import Client  # noqa: E402
from queasy_py.store.embedded import EmbeddedServer, find_server_binary, free_port  # noqa: E402

#: values per job in a dequeue reply with the reply 'rec' (library 5.1.0: id, token, record)
JOB_WIDTH = 3
#: values per job in the reply without it (id, token, data, run_at, 3 counts, trace)
WIDE_WIDTH = 8
#: --reply: queasy_dequeue's ARGV[8] and the values per job of its reply
REPLIES = {"rec": ("rec", JOB_WIDTH), "wide": ("", WIDE_WIDTH)}
#: what this script sends itself (not run inside an FCALL)
OUTSIDE = {"fcall", "fcall_ro", "info", "ping", "hello", "client|setinfo", "function|load"}


def stats(r) -> dict[str, tuple[int, int]]:
    """(calls, usec) of each command so far."""
    out = r.info("commandstats")
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in out.items()}


def cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


class Callgrind:
    """A valkey-server under callgrind (no password, 127.0.0.1, a free port, no persistence);
    `instructions()` dumps the counts since the last dump and returns their total."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        out = f"--callgrind-out-file={workdir}/cg.out"
        cmd = ["valgrind", "--tool=callgrind", out, find_server_binary(), "--port",
               str(self.port), "--save", "", "--appendonly", "no"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.pid = self.proc.pid
        self.dumps = 0
        deadline = time.monotonic() + 120  # a server under valgrind takes a while to answer
        with redis.Redis.from_url(self.url) as r:
            while True:
                try:
                    r.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise
                    time.sleep(0.2)

    def instructions(self) -> int:
        self.dumps += 1
        subprocess.run(["callgrind_control", "-d", str(self.pid)], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        path = f"{self.workdir}/cg.out.{self.dumps}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError):
                for line in Path(path).read_text().splitlines():
                    if line.startswith(("summary:", "totals:")):
                        return int(line.split()[1])
            time.sleep(0.1)
        raise RuntimeError(f"no callgrind dump in {path}: {glob.glob(self.workdir + '/*')}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


@contextlib.contextmanager
def server_for(args: argparse.Namespace) -> Iterator[tuple[str, int, Callgrind | None]]:
    """(url, pid, the Callgrind or None) of a server of this run's own."""
    if not args.callgrind:
        with EmbeddedServer() as embedded:
            yield embedded.url, embedded.pid, None
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("--callgrind needs valgrind (and callgrind_control) on PATH")
    with contextlib.ExitStack() as stack:
        workdir = args.keep_dumps or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="server-cost-")
        )
        Path(workdir).mkdir(parents=True, exist_ok=True)
        grind = Callgrind(workdir)
        try:
            yield grind.url, grind.pid, grind
        finally:
            grind.stop()


def measure(
    r, server: psutil.Process, n: int, step: Callable[[], None], grind: Callgrind | None
) -> dict:
    if grind is not None:
        grind.instructions()  # zero the counts
    before, cpu0 = stats(r), cpu(server)
    step()
    after, cpu1 = stats(r), cpu(server)
    instructions = grind.instructions() / n if grind is not None else None
    ran = {
        k: (v[0] - before.get(k, (0, 0))[0], v[1] - before.get(k, (0, 0))[1])
        for k, v in after.items()
    }
    fcall = ran.get("fcall", (0, 0))
    inner = {k: v for k, v in ran.items() if k not in OUTSIDE and v[0] > 0}
    return {
        "fcalls": fcall[0],
        "fcall_us": fcall[1] / n,
        "cpu_us": (cpu1 - cpu0) * 1e6 / n,
        "inner": {k: (c / n, u / n) for k, (c, u) in inner.items()},
        "instructions": instructions,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=10, help="jobs per dequeue and finish")
    parser.add_argument("--maxlen", type=int, default=100000, help="events kept (0: none)")
    parser.add_argument("--keep", type=int, default=1000, help="finished records kept")
    parser.add_argument("--callgrind", action="store_true", help="count instructions too")
    parser.add_argument(
        "--reply",
        choices=sorted(REPLIES),
        default="rec",
        help="dequeue's reply: rec (id, token, record: library 5.1.0) or wide (8 values per job)",
    )
    parser.add_argument(
        "--keep-dumps",
        metavar="DIR",
        help="with --callgrind: keep the dumps in DIR for callgrind_annotate (cg.out.2 dispatch,"
        " .4 dequeue, .6 finish, .8 and .10 the sink's two paths; the odd ones between phases)",
    )
    args = parser.parse_args()
    n, batch = args.n, args.batch
    form, width = REPLIES[args.reply]
    with server_for(args) as (url, pid, grind), Client(url, prefix="cost") as client:
        r, server = client.redis, psutil.Process(pid)
        q = client.queue("bench")
        base = q.keys.base
        leases: list[tuple[bytes, bytes]] = []

        def dispatch() -> None:
            for i in range(0, n, 1000):
                q.dispatch_many([{"data": k} for k in range(i, min(n, i + 1000))])

        def dequeue() -> None:
            k = 0
            while True:
                k += 1
                reply = r.execute_command(
                    "FCALL", "queasy_dequeue", 1, base, "", "c1", f"n{k}", batch, 60000,
                    args.maxlen, 1, form,
                )  # fmt: skip
                jobs = reply[2:]
                if not jobs:
                    return
                leases.extend((jobs[j], jobs[j + 1]) for j in range(0, len(jobs), width))

        def finish() -> None:
            started = int(time.time() * 1000)
            head = ["", "c1", args.maxlen, args.keep, 3600000, "bench-host", 0]
            for i in range(0, len(leases), batch):
                acks = [x for job, token in leases[i : i + batch] for x in (job, token, 4242)]
                flat: list = []
                for j in range(0, len(acks), 3):
                    flat += [*acks[j : j + 3], started, ""]
                codes = r.execute_command("FCALL", "queasy_finish", 1, base, *head, *flat)
                if any(codes):  # a stale ack costs less than a finish: it would skew the count
                    raise SystemExit(f"finish answered stale: {codes}")

        def with_ids(name: str, dedup: bool) -> Callable[[], None]:
            """N jobs of the Spark benchmark's shape (id user-<i>) into a queue of their own."""
            queue = client.queue(name)

            def step() -> None:
                for i in range(0, n, 1000):
                    jobs = [
                        {"id": f"user-{k}", "data": {"user_id": f"user-{k}",
                                                     "email": f"user{k}@example.com", "n": k}}
                        for k in range(i, min(n, i + 1000))
                    ]  # fmt: skip
                    if dedup:
                        queue.dispatch_batch(jobs, dedup_window=86400.0)
                    else:
                        queue.dispatch_many(jobs)

            return step

        # a first round so the retention trims and the event stream are in their steady state
        dispatch(), dequeue(), finish(), leases.clear()
        phases = [
            ("dispatch (dispatch_many, calls of 1,000)", dispatch),
            (f"dequeue ({batch} per FCALL)", dequeue),
            (f"finish ({batch} per FCALL)", finish),
            ("dispatch_many with ids (calls of 1,000)", with_ids("ids", False)),
            ("dispatch_once (dedup_window, calls of 1,000)", with_ids("once", True)),
        ]
        rows = [(name, measure(r, server, n, step, grind)) for name, step in phases]
    print(f"{n:,} no-op jobs, {batch} per dequeue/finish, maxlen {args.maxlen}, keep {args.keep}")
    print()
    grind_col = " server instructions/job |" if grind else ""
    print("| function | FCALL µs/job | process CPU µs/job | inner commands: calls/job, µs/job"
          f" | Lua side µs/job |{grind_col}")  # fmt: skip
    print("|---|---:|---:|---|---:|" + ("---:|" if grind else ""))
    total = [0.0, 0.0, 0.0, 0.0]
    for name, m in rows[:3]:
        inner = sorted(m["inner"].items(), key=lambda kv: -kv[1][1])
        inner_us = sum(u for _, u in m["inner"].values())
        shown = ", ".join(f"{k} {c:.2f} / {u:.2f}" for k, (c, u) in inner if c >= 0.05 or u >= 0.05)
        lua = m["fcall_us"] - inner_us
        ins = m["instructions"] or 0.0
        total = [total[0] + m["fcall_us"], total[1] + m["cpu_us"], total[2] + lua, total[3] + ins]
        extra = f" {ins / 1000:,.1f}k |" if grind else ""
        print(f"| {name} | {m['fcall_us']:.1f} | {m['cpu_us']:.1f} | {shown} | {lua:.1f} |{extra}")
    extra = f" **{total[3] / 1000:,.1f}k** |" if grind else ""
    print(
        f"| **a job's path** | **{total[0]:.1f}** | **{total[1]:.1f}** | | **{total[2]:.1f}** |"
        + extra
    )
    for name, m in rows[3:]:  # the sink's two paths, not part of a job's path
        inner = sorted(m["inner"].items(), key=lambda kv: -kv[1][1])
        inner_us = sum(u for _, u in m["inner"].values())
        shown = ", ".join(f"{k} {c:.2f} / {u:.2f}" for k, (c, u) in inner if c >= 0.05 or u >= 0.05)
        extra = f" {(m['instructions'] or 0.0) / 1000:,.1f}k |" if grind else ""
        print(
            f"| {name} | {m['fcall_us']:.1f} | {m['cpu_us']:.1f} | {shown} |"
            f" {m['fcall_us'] - inner_us:.1f} |{extra}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
