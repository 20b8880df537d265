"""The job-event history on Spark: run some jobs, archive their outcome events, report.

    pip install -e '.[spark]'
    python examples/history_report.py [--jobs 3000] [--spread 30] [--out report.html] [--png x.png]

Uses $QUEASY_REDIS_URL, else starts an embedded server. A supervisor runs jobs of two queues
whose handler (`handle` below) takes a few milliseconds, sometimes fails and is retried, and
sometimes fails for good; then `queasy history archive` and `queasy history report` (the same
functions, here in-process) write the Parquet archive and the report.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

from queasy_py import Client, Job, PermanentError
from queasy_py.job import LIVE_STATES


class FlakyService(Exception):
    pass


def handle(data: dict, job: Job) -> None:
    time.sleep(data["ms"] / 1000)
    if data["fate"] == "flaky" and job.retry_count == 0:
        raise FlakyService("the service answered 503")
    if data["fate"] == "broken":
        raise PermanentError(f"no such account: {data['account']}")


def run_jobs(n: int, workers: int, spread: float) -> None:
    client = Client(workers=workers)  # $QUEASY_REDIS_URL, set by main()
    rng = random.Random(7)
    for name, slow in (("invoices", 8.0), ("emails", 2.0)):
        queue = client.queue(name)
        queue.listen("history_report", size=5, min_backoff=0.05, max_backoff=0.1)
        queue.dispatch_many(
            {
                "data": {
                    "ms": round(rng.expovariate(1 / slow), 2),
                    "fate": rng.choices(["ok", "flaky", "broken"], [90, 8, 2])[0],
                    "account": rng.randrange(1000),
                },
                "delay": rng.uniform(0, spread) ** 2 / spread,  # more at first, then fewer
            }
            for _ in range(n // 2)
        )

    def live(name: str) -> int:  # counts() also has the totals of ended jobs
        counts = client.queue(name).counts()
        return sum(counts[state] for state in LIVE_STATES)

    def stop_when_done() -> None:
        while any(live(q) for q in ("invoices", "emails")):
            time.sleep(0.2)
        client.stop()

    threading.Thread(target=stop_when_done, daemon=True).start()
    try:
        client.run()
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--spread", type=float, default=30.0, help="seconds the jobs are due over")
    parser.add_argument("--path", help="archive directory (default: a temporary one)")
    parser.add_argument("--out", default="report.html")
    parser.add_argument("--png", help="also save the plots here")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    server = None
    url = os.environ.get("QUEASY_REDIS_URL")
    if url is None:
        from queasy_py.store.embedded import EmbeddedServer

        server = EmbeddedServer().start()
        url = server.url
    os.environ["QUEASY_REDIS_URL"] = url
    try:
        run_jobs(args.jobs, args.workers, args.spread)
        from queasy_py.spark import report
        from queasy_py.spark.archive import archive
        from queasy_py.spark.plots import figure_png
        from queasy_py.spark.session import session

        spark, _ = session("local[2]", app="history_report example")
        path = args.path or tempfile.mkdtemp(prefix="queasy-archive-")
        done = archive(spark, path, url=url, queues=["invoices", "emails"])
        print(f"archived {done.events} events into {path}")
        result = report.compute(spark, path)
        spark.stop()
        print(report.summary(result))
        png = figure_png(result)
        Path(args.out).write_text(report.html(result, png))
        print(f"report written to {args.out}")
        if args.png:
            Path(args.png).write_bytes(png)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
