"""`queasy history archive|report`: the job-event history on Spark (the `spark` extra)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .. import defaults
from ..errors import ConfigError
from . import exitcodes, show


def add_parser(sub: argparse._SubParsersAction, common: list[argparse.ArgumentParser]) -> None:
    """`common`: the options every subcommand takes (--log-level after it)."""
    history = sub.add_parser(
        "history", parents=common, help="archive and report the job-event history (Spark)"
    )
    commands = history.add_subparsers(dest="history_command", required=True)
    archive = commands.add_parser(
        "archive",
        parents=common,
        help="append new outcome events, exactly once, to a Parquet archive",
    )
    archive.add_argument("--path", required=True, help="archive directory (any Hadoop path)")
    archive.add_argument(
        "--queue", action="append", dest="queues", help="a queue (repeat; default every queue)"
    )
    archive.add_argument("--no-fail-queues", action="store_true", help="leave fail queues out")
    archive.add_argument(
        "--skip-trimmed",
        action="store_true",
        help="go on when events were trimmed before they were archived (default: fail)",
    )
    archive.add_argument("--max-events-per-trigger", type=int, help="events per Spark batch")
    archive.add_argument("--redis", help=f"Redis URL (default ${defaults.URL_ENV})")
    archive.add_argument("--prefix", default=defaults.PREFIX)
    report = commands.add_parser(
        "report", parents=common, help="a report of the archive: HTML and a summary"
    )
    report.add_argument("--path", required=True, help="archive directory")
    report.add_argument("--out", help="write the HTML report here (default: no HTML)")
    report.add_argument("--top", type=int, default=10, help="top errors and slowest jobs shown")
    for parser in (archive, report):
        parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
        parser.add_argument(
            "--conf", action="append", default=[], metavar="K=V", help="a Spark setting (repeat)"
        )


def spark_conf(pairs: list[str]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--conf takes KEY=VALUE, not {pair!r}")
        conf[key.strip()] = value
    return conf


def run(args: argparse.Namespace) -> int:
    conf = spark_conf(args.conf)
    try:
        from ..spark.session import session
    except ImportError as exc:
        raise ConfigError(
            f"queasy history needs the spark extra: pip install 'queasy_py[spark]' ({exc})"
        ) from None
    if args.history_command == "archive":
        url = args.redis or os.environ.get(defaults.URL_ENV)
        if not url:
            raise ConfigError(f"give --redis URL or set ${defaults.URL_ENV}")
        if args.max_events_per_trigger is not None and args.max_events_per_trigger < 1:
            raise ConfigError("--max-events-per-trigger must be >= 1")
        spark, owned = session(args.master, conf, "queasy history archive")
        try:
            from ..spark.archive import archive

            done = archive(
                spark,
                args.path,
                url=url,
                prefix=args.prefix,
                queues=args.queues,
                fail_queues=not args.no_fail_queues,
                fail_on_data_loss=not args.skip_trimmed,
                max_events_per_trigger=args.max_events_per_trigger,
            )
        finally:
            if owned:
                spark.stop()
        print(f"archived {done.events} events in {done.batches} batches into {args.path}")
        return exitcodes.OK
    spark, owned = session(args.master, conf, "queasy history report")
    try:
        from pyspark.errors import AnalysisException

        from ..spark import report as reports
        from ..spark.plots import figure_png

        try:
            result = reports.compute(spark, args.path, top=args.top)
        except AnalysisException as exc:  # no archive there (a path any Hadoop FS reads)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"cannot read the archive {args.path}: {first}") from None
    finally:
        if owned:
            spark.stop()
    print(show.printable(reports.summary(result)))
    if args.out:
        Path(args.out).write_text(reports.html(result, figure_png(result)))
        print(f"report written to {args.out}", file=sys.stderr)
    return exitcodes.OK
