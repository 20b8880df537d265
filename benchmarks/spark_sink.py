"""The Spark sink's rows/s against plain dispatch_many from one process.

    python benchmarks/spark_sink.py [--n 1000000] [--master local[2]] [--repeat 1]

Starts its own valkey-server (the embedded one) and, for each mode, flushes it (and waits until
the server freed the last mode's keys: no mode pays for them), dispatches N jobs of the same
shape ({"user_id": str, "email": str, "n": int}, the id from user_id) and prints the wall rate
and the CPU each side spent per row:

- `dispatch_many`: one process, calls of 10,000 jobs (each sent as pipelined FCALLs of 500);
  then the same without ids (new ids of 32 hex digits, as the sink's rows without an id
  column get: the fair peer of that mode; a longer id costs the server more);
- `dispatch_batch(dedup_window=...)`: the same with the sink's dedup (queasy_dispatch_once);
- `sink`: `df.write.format("queasy")` of a DataFrame of N generated rows on `--master`, with
  `id_column` (so with its dedup window, queasy_dispatch_once) and without one.

The Spark session starts before the clock and a warm-up write of 10,000 rows starts its Python
workers; the timed part is the write alone. CPU is read from /proc (the server, this process,
and Spark's JVM with its Python workers), so a loaded machine changes the wall rate more than
the CPU per row.

Each row also says what the server was sent per row (INFO stats and commandstats): bytes read,
reads, FCALLs and the commands run inside them. With `--callgrind DIR` the server runs under
`valgrind --tool=callgrind` (about 50 times slower: use a small --n such as 20000) and each
row gets the instructions the server executed per row, a count that does not depend on the
machine's load; the dump of each mode stays in DIR (`callgrind_annotate DIR/cg.out.<k>`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import psutil
import redis

REPO = Path(__file__).resolve().parent.parent
# benchmarks/profile.py would shadow the standard library's profile (pyspark imports cProfile)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "benchmarks"]
sys.path.insert(0, str(REPO))

from benchmarks.server_cost import Callgrind  # noqa: E402
from queasy_py import Client  # noqa: E402
from queasy_py.store.embedded import EmbeddedServer  # noqa: E402

#: the counters of server_counts() reported per row, and the commands sent from outside
COUNTERS = ("net_in", "reads", "fcall")
OUTSIDE = {"fcall", "fcall_ro", "info", "ping", "hello", "client|setinfo", "function|load",
           "function|list", "flushall", "sadd", "select"}  # fmt: skip


def cpu(proc: psutil.Process, tree: bool = False) -> float:
    """CPU seconds of `proc` (and, with `tree`, of its live descendants), each with its
    reaped children's (Spark's Python daemon forks and reaps its workers)."""
    procs = [proc]
    if tree:
        try:
            procs += proc.children(recursive=True)
        except psutil.Error:
            pass
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def server_counts(r: redis.Redis) -> dict[str, int]:
    """What the server was sent so far: bytes read, reads, and the calls of each command."""
    stats = r.info("stats")
    out = {
        "net_in": int(stats["total_net_input_bytes"]),
        "reads": int(stats.get("total_reads_processed", 0)),
    }
    for key, value in r.info("commandstats").items():
        out[key.removeprefix("cmdstat_")] = int(value["calls"])
    return out


class Meter:
    """Wall time and CPU of the server, this process and the JVM tree over a measured span,
    the server's counters and, under callgrind, its instructions."""

    def __init__(
        self,
        r: redis.Redis,
        server_pid: int,
        jvm: psutil.Process | None,
        grind: Callgrind | None = None,
    ) -> None:
        self.r = r
        self.server = psutil.Process(server_pid)
        self.me = psutil.Process()
        self.jvm = jvm
        self.grind = grind

    def read(self) -> tuple:
        me = self.me.cpu_times()
        return (
            time.perf_counter(),
            cpu(self.server),
            me.user + me.system,
            cpu(self.jvm, tree=True) if self.jvm else 0.0,
            server_counts(self.r),
            self.grind.instructions() if self.grind else 0,  # (since the last dump)
            self.grind.dumps if self.grind else 0,
        )


def report(name: str, n: int, before: tuple, after: tuple) -> dict:
    wall, server, me, jvm = (b - a for a, b in zip(before[:4], after[:4], strict=True))
    ran = {k: v - before[4].get(k, 0) for k, v in after[4].items()}
    row = {
        "mode": name,
        "rows": n,
        "seconds": round(wall, 2),
        "rows_per_s": round(n / wall),
        "server_us_per_row": round(server / n * 1e6, 2),
        "driver_us_per_row": round(me / n * 1e6, 2),
        # (a Spark Python worker that exits between writes takes its CPU with it: only the
        # sink's rows are read while its workers live)
        "spark_us_per_row": round(jvm / n * 1e6, 2) if name.startswith("sink") else None,
        "per_row": {k: round(ran.get(k, 0) / n, 3) for k in COUNTERS},
        "inner_per_row": {
            k: round(v / n, 3)
            for k, v in sorted(ran.items())
            if v and k not in OUTSIDE and k not in COUNTERS
        },
    }
    if after[5]:
        row["server_instructions_per_row"] = round(after[5] / n)
        row["callgrind_dump"] = f"cg.out.{after[6]}"
    print(json.dumps(row), flush=True)
    return row


def fresh(client: Client, lazy: bool = False) -> None:
    """An empty server, the library loaded, and no key of the last mode left to free: the
    server's FLUSHALL (valkey 8, lazyfree-lazy-user-flush yes) frees them in a thread of its
    own while the next mode runs, which counted 2-3 µs/row of that work in the next mode's
    server CPU and took a core from it; this waits for lazyfree_pending_objects 0 (polled: a
    FLUSHALL SYNC of 1,000,000 jobs outlasts the client's socket timeout on a loaded machine).
    `lazy`: do not wait, as this benchmark did before, to compare."""
    r = client.redis
    r.flushall(asynchronous=True)
    deadline = time.monotonic() + 300
    while not lazy and int(r.info("memory").get("lazyfree_pending_objects", 0)) > 0:
        if time.monotonic() > deadline:
            raise SystemExit("the server still frees the keys of the last mode after 300 s")
        time.sleep(0.05)
    from queasy_py.store.library import ensure_loaded

    ensure_loaded(r)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--lazy-flush", action="store_true", help="no wait for the flush to free (as before)"
    )
    parser.add_argument("--callgrind", metavar="DIR", help="server under callgrind, dumps in DIR")
    args = parser.parse_args()

    grind = None
    if args.callgrind:
        os.makedirs(args.callgrind, exist_ok=True)
        server = grind = Callgrind(os.path.abspath(args.callgrind))
    else:
        server = EmbeddedServer().start()
    try:
        client = Client(server.url, workers=0, prefix="bench")
        os.environ["PYSPARK_PYTHON"] = sys.executable
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        import queasy_py.spark as qs

        spark = (
            SparkSession.builder.master(args.master)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        qs.register(spark)
        jvm = next((p for p in psutil.Process().children() if "java" in p.name().lower()), None)
        meter = Meter(client.redis, server.pid, jvm, grind)

        def frame(n: int):  # noqa: ANN202
            return spark.range(0, n, 1, 2).select(
                F.concat(F.lit("user-"), "id").alias("user_id"),
                F.concat(F.lit("user"), "id", F.lit("@example.com")).alias("email"),
                F.col("id").alias("n"),
            )

        def write(df, **options: str) -> None:  # noqa: ANN001
            df.write.format("queasy").option("url", server.url).option("prefix", "bench").option(
                "queue", "bench"
            ).options(**options).mode("append").save()

        write(frame(10_000), id_column="user_id")  # warm-up: Python workers started
        rows = []
        for _ in range(args.repeat):
            fresh(client, args.lazy_flush)
            q = client.queue("bench")
            before = meter.read()
            for start in range(0, args.n, 10_000):
                q.dispatch_many(
                    {
                        "data": {"user_id": f"user-{i}", "email": f"user{i}@example.com", "n": i},
                        "id": f"user-{i}",
                    }  # fmt: skip
                    for i in range(start, min(args.n, start + 10_000))
                )
            rows.append(report("dispatch_many, 1 process", args.n, before, meter.read()))
            fresh(client, args.lazy_flush)
            before = meter.read()  # the fair peer of the sink without an id column: new ids
            for start in range(0, args.n, 10_000):
                q.dispatch_many(
                    {"data": {"user_id": f"user-{i}", "email": f"user{i}@example.com", "n": i}}
                    for i in range(start, min(args.n, start + 10_000))
                )
            rows.append(report("dispatch_many, no ids, 1 process", args.n, before, meter.read()))
            fresh(client, args.lazy_flush)
            before = meter.read()
            for start in range(0, args.n, 10_000):
                q.dispatch_batch(
                    [
                        {
                            "data": {
                                "user_id": f"user-{i}",
                                "email": f"user{i}@example.com",
                                "n": i,
                            },
                            "id": f"user-{i}",
                        }  # fmt: skip
                        for i in range(start, min(args.n, start + 10_000))
                    ],
                    dedup_window=86400.0,
                )
            rows.append(
                report("dispatch_batch(dedup_window), 1 process", args.n, before, meter.read())
            )
            for name, options in (
                (f"sink on {args.master}, id_column", {"id_column": "user_id"}),
                (f"sink on {args.master}, no id column", {}),
            ):
                fresh(client, args.lazy_flush)
                df = frame(args.n)
                before = meter.read()
                write(df, **options)
                rows.append(report(name, args.n, before, meter.read()))
        assert client.queue("bench").counts()["waiting"] == args.n
        spark.stop()
        client.close()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
