"""python -m tests.chaos --seconds N --processes P [--url URL] [--seed S]

Runs the chaos test against URL (default: a private embedded server) and prints
`chaos: N jobs, K kills, V violations`; exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import sys
import uuid

from queasy_py.store.embedded import EmbeddedServer

from .run import run_chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="chaos phase length")
    parser.add_argument("--processes", type=int, default=3, help="supervisor processes")
    parser.add_argument("--url", help="Redis URL (default: an embedded server)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=25.0, help="new chains per second")
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    if args.processes < 2:
        parser.error("--processes must be at least 2 (one always keeps running)")
    server = None
    url = args.url
    if url is None:
        server = EmbeddedServer().start()
        url = server.url
    try:
        summary = run_chaos(
            url,
            f"chaos-{uuid.uuid4().hex[:8]}",
            seconds=args.seconds,
            processes=args.processes,
            seed=args.seed,
            rate=args.rate,
            drain_timeout=args.drain_timeout,
        )
    finally:
        if server is not None:
            server.stop()
    print(" ".join(f"{k}={v}" for k, v in summary.details.items()))
    if summary.violations:
        print(f"supervisor logs: {summary.logs[0].parent if summary.logs else '-'}")
    print(summary.line)
    return 1 if summary.violations else 0


if __name__ == "__main__":
    sys.exit(main())
