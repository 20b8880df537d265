"""A queasy_py supervisor for the benchmark: Client(url, workers=2) listening to queue "bench"
with the no-op handler; runs until SIGTERM/SIGINT. Started by queasy_bench.py."""

import os
import sys

from queasy_py import Client


def main() -> int:
    client = Client(os.environ["BENCH_REDIS_URL"], workers=2)
    q = client.queue("bench")
    q.listen("benchmarks.peers.tasks.queasy_noop", size=10, timeout=60.0)
    try:
        return client.run() or 0
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
