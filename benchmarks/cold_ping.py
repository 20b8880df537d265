"""A cold round trip to the server: what an idle pickup pays per hop on this machine.

    python benchmarks/cold_ping.py [--n 200] [--gap-ms 10]

Starts a valkey-server of its own (run.py's Server), then times PING from one redis-py client
--n times, each after --gap-ms of sleep (as the idle-pickup benchmark spaces its jobs: both
processes idle between), and --n times back to back. Prints the medians and p90s in µs. A
round trip is two hops, each waking an idle process; an idle pickup of queasy_py takes three
(producer to server, server to supervisor, supervisor to worker), huey's two (producer to
server, server to the worker blocked in BRPOP).
"""

from __future__ import annotations

import argparse
import time

import redis
from run import Server


def timed(fn, n: int, gap: float) -> list[float]:
    out = []
    for _ in range(n):
        if gap:
            time.sleep(gap)
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e6)
    return sorted(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--gap-ms", type=float, default=10.0)
    args = ap.parse_args()
    server = Server().start()
    try:
        r = redis.Redis.from_url(server.url(0))
        r.ping()
        for label, gap in (
            (f"after {args.gap_ms:g} ms idle", args.gap_ms / 1000),
            ("back to back", 0),
        ):
            lat = timed(r.ping, args.n, gap)
            p50, p90 = lat[len(lat) // 2], lat[int(len(lat) * 0.9)]
            print(f"PING {label}: p50 {p50:.0f} µs, p90 {p90:.0f} µs")
        r.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
