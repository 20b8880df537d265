"""Bulk dispatch from Spark: generate rows, dispatch them as jobs, watch them processed.

    pip install -e '.[spark]'          # pyspark, pyarrow (Java 17+ on the machine)
    python examples/spark_dispatch.py [--rows 1000000] [--workers 2] [--master local[2]]

Uses $QUEASY_REDIS_URL, else starts an embedded server. This process runs a supervisor (its
workers run `handle` below) while a thread builds a DataFrame of `--rows` users and writes it
with the `queasy` sink, one job per row, keyed by user_id: run it twice against the same server
and the second write skips every id (the sink's dedup window).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from queasy_py import Client, Job
from queasy_py.job import LIVE_STATES


def handle(data: dict, job: Job) -> None:
    """The job: a welcome email for one user (here: nothing, the point is the pipeline)."""


def dispatch_and_watch(client: Client, url: str, rows: int, master: str) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import queasy_py.spark

    spark = (
        SparkSession.builder.master(master)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    queasy_py.spark.register(spark)
    users = spark.range(rows).select(
        F.concat(F.lit("user-"), "id").alias("user_id"),
        F.concat(F.lit("user"), "id", F.lit("@example.com")).alias("email"),
        (F.col("id") % 7 == 0).alias("newsletter"),
        F.current_timestamp().alias("signed_up"),
    )
    started = time.perf_counter()
    counts = queasy_py.spark.dispatch_dataframe(users, "welcome", id_column="user_id", url=url)
    took = time.perf_counter() - started
    print(f"dispatched {counts} in {took:.1f}s ({counts.rows / took:,.0f} rows/s)", flush=True)
    spark.stop()
    queue = client.queue("welcome")
    while True:  # until no job is live (counts() also has the totals of ended jobs)
        counts = queue.counts()
        left = {state: counts[state] for state in LIVE_STATES}
        print("left:", left, "finished:", counts["finished"], flush=True)
        if sum(left.values()) == 0:
            break
        time.sleep(1.0)
    client.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    with Client(workers=args.workers) as client:
        client.queue("welcome").listen("spark_dispatch", size=5)
        watcher = threading.Thread(
            target=dispatch_and_watch,
            args=(client, client.url, args.rows, args.master),
            daemon=True,
        )
        watcher.start()
        client.run()  # until the watcher sees every job done


if __name__ == "__main__":
    main()
