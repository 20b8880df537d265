"""python -m tests.chaos --seconds N --processes P [--url URL] [--records-url URL] [--seed S]

Runs the chaos test against URL (default: a private embedded server that allows CONFIG, for
the server faults) with the handlers' records on a second server (default: another private
embedded server), and prints `chaos: N jobs, K kills, V violations`; exits 1 on any violation.
Against a --url server the faults it does not allow are left out (a freeze needs a server
this process started).
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
    parser.add_argument("--url", help="Redis URL of the queues (default: an embedded server)")
    parser.add_argument("--records-url", help="Redis URL of the records (default: embedded)")
    parser.add_argument("--no-hostile", action="store_true", help="no hostile producer")
    parser.add_argument(
        "--start-during-faults",
        action="store_true",
        help="(re)start supervisors while the server has a fault (a known start-up crash)",
    )
    parser.add_argument(
        "--forge-pushes",
        action="store_true",
        help="the hostile producer also forges well-formed pushes (a known weakness)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=25.0, help="new chains per second")
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    if args.processes < 2:
        parser.error("--processes must be at least 2 (one always keeps running)")
    servers: list[EmbeddedServer] = []
    try:
        url, pid = args.url, None
        if url is None:
            servers.append(EmbeddedServer(admin_commands=True).start())  # CONFIG SET maxmemory
            url, pid = servers[-1].url, servers[-1].pid
        records_url = args.records_url
        if records_url is None:
            servers.append(EmbeddedServer().start())
            records_url = servers[-1].url
        summary = run_chaos(
            url,
            f"chaos-{uuid.uuid4().hex[:8]}",
            seconds=args.seconds,
            processes=args.processes,
            seed=args.seed,
            rate=args.rate,
            drain_timeout=args.drain_timeout,
            records_url=records_url,
            server_pid=pid,
            hostile=not args.no_hostile,
            start_during_faults=args.start_during_faults,
            forge_pushes=args.forge_pushes,
        )
    finally:
        for server in servers:
            server.stop()
    print(" ".join(f"{k}={v}" for k, v in summary.details.items()))
    if summary.violations:
        print(f"supervisor logs: {summary.logs[0].parent if summary.logs else '-'}")
    print(summary.line)
    return 1 if summary.violations else 0


if __name__ == "__main__":
    sys.exit(main())
