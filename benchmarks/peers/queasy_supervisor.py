"""A queasy_py supervisor for the benchmark: Client(url, workers=W) listening to queue "bench"
with the no-op handler at size S; runs until SIGTERM/SIGINT. Started by queasy_bench.py.

    queasy_supervisor.py [W [S]]     (default 2 workers, size 10)"""

import os
import sys

from queasy_py import Client


def main() -> int:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    client = Client(os.environ["BENCH_REDIS_URL"], workers=workers)
    q = client.queue("bench")
    q.listen("benchmarks.peers.tasks.queasy_noop", size=size, timeout=60.0)
    try:
        return client.run() or 0
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
