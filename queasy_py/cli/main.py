"""The `queasy` command: run a supervisor or the embedded server, dispatch and cancel jobs,
drop a schedule, and see and act on queues (status, jobs, inspect, requeue, purge, events)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

import orjson

from .. import defaults
from ..client import Client
from ..errors import (
    AuthenticationFailed,
    ConfigError,
    ConnectionFailed,
    HandlerError,
    InvalidInput,
    JobNotFound,
    QueasyError,
    VersionMismatch,
)
from ..resolve import config_table, data_dir_for, find_pyproject, resolve
from ..store.connection import mask_url
from ..validate import key_prefix
from . import config as config_file
from . import dashboard, exitcodes, history, operate
from .metricsopts import OPTIONS, check_metrics

log = logging.getLogger("queasy_py")


#: the levels --log-level takes (any case)
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(text: str) -> str:
    level = text.upper()
    if level not in LEVELS:
        raise argparse.ArgumentTypeError(f"unknown level {text!r} (one of {', '.join(LEVELS)})")
    return level


class Parser(argparse.ArgumentParser):
    """argparse with each error on one line and exit code CONFIG (2), no usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(exitcodes.CONFIG, f"{self.prog}: error: {message} (see {self.prog} -h)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="queasy", description=__doc__)
    level_help = "logging level of the command and its workers: DEBUG, INFO (default), WARNING, ..."
    parser.add_argument("--log-level", type=log_level, default="INFO", help=level_help)
    # also after the subcommand; SUPPRESS: not given there, the value before it (or INFO) holds
    common = Parser(add_help=False)
    common.add_argument("--log-level", type=log_level, default=argparse.SUPPRESS, help=level_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", parents=[common], help="run a supervisor from a TOML config")
    run.add_argument(
        "config", nargs="?", help="TOML file (default: [tool.queasy] in ./pyproject.toml)"
    )
    add_server_options(run)
    run.add_argument("--workers", type=int, help="worker processes (overrides `workers`)")
    run.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus /metrics on this port, 0 for any free one (overrides "
        "`metrics_port`; needs queasy_py[metrics])",
    )
    run.add_argument(
        "--metrics-host", help="address of /metrics (overrides `metrics_host`; 127.0.0.1)"
    )

    server = sub.add_parser(
        "server",
        parents=[common],
        help="run the project's embedded server in the foreground",
    )
    server.add_argument("--config", help="TOML file: the data dir is .queasy/ next to it")
    server.add_argument(
        "--data-dir", help=f"the server's data directory (${defaults.DATA_DIR_ENV})"
    )

    dispatch = sub.add_parser("dispatch", parents=[common], help="dispatch one job")
    dispatch.add_argument("queue")
    dispatch.add_argument("data", help="the job's data as JSON")
    dispatch.add_argument("--id", help="job id (default: generated)")
    dispatch.add_argument("--delay", type=float, help="seconds from now")
    add_server_options(dispatch, config=True)

    cancel = sub.add_parser(
        "cancel", parents=[common], help="cancel a waiting, delayed or blocked job"
    )
    cancel.add_argument("queue")
    cancel.add_argument("id")
    add_server_options(cancel, config=True)
    unschedule = sub.add_parser(
        "unschedule",
        parents=[common],
        help="drop a queue's schedule (removed from the supervisors' config) and its pending "
        "occurrence",
    )
    unschedule.add_argument("queue")
    add_server_options(unschedule, config=True)
    operate.add_parsers(sub, common, add_server_options)
    history.add_parser(sub, [common])
    dashboard.add_parser(sub, [common], add_server_options)
    return parser


def add_server_options(parser: argparse.ArgumentParser, config: bool = False) -> None:
    """--redis, --data-dir (and --config, --prefix): the server is found as resolve.py says."""
    parser.add_argument(
        "--redis",
        help=f"Redis URL (default: ${defaults.URL_ENV}, else the config's `redis`, "
        "else the project's embedded server)",
    )
    parser.add_argument(
        "--data-dir",
        help=f"the embedded server's data directory (default: ${defaults.DATA_DIR_ENV}, "
        f"else {defaults.STATE_DIR_NAME}/ next to the config file or pyproject.toml)",
    )
    if config:
        parser.add_argument(
            "--config", help="TOML file read for `redis` and `prefix` (default: ./pyproject.toml "
            "or the first one above, its [tool.queasy])"
        )  # fmt: skip
        parser.add_argument("--prefix", help="key prefix (default: the config's, else queasy)")


def producer(args: argparse.Namespace) -> Client:
    """A producer-only client on the server and with the prefix `queasy run` would use."""
    config = args.config or find_pyproject()
    prefix = args.prefix or (config_table(config) if config else {}).get("prefix")
    if not args.prefix and prefix is not None:  # before a server is started or joined
        try:
            key_prefix(prefix)
        except InvalidInput as exc:
            raise ConfigError(f"{config}: prefix: {exc}") from None
    target = resolve(args.redis, config=args.config, data_dir=args.data_dir, given="--redis")
    return Client(target, workers=0, prefix=prefix or defaults.PREFIX)


def app_on_path() -> None:
    """Put the working directory on sys.path, after the installed packages (a file there never
    shadows one of them), so that `queasy run` in an app's directory imports `myapp.jobs` as
    celery, rq, dramatiq and arq do. The workers get this sys.path (runtime.pool)."""
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != cwd] + [cwd]


def connect_retrying(client: Client) -> None:
    """Wait for an unreachable server for RUN_CONNECT_TIMEOUT with backoff, logging one line
    per try (refused credentials, a bad URL or a server without Functions are not retried)."""
    deadline = time.monotonic() + defaults.RUN_CONNECT_TIMEOUT
    delay = 1.0
    tries = 1
    while True:
        try:
            client.ready(attempts=1)
            return
        except AuthenticationFailed:
            raise
        except ConnectionFailed as exc:
            if time.monotonic() + delay > deadline:
                raise ConnectionFailed(
                    f"{exc} (gave up after {tries} tries in {defaults.RUN_CONNECT_TIMEOUT:g}s)"
                ) from None
            log.warning("%s; retrying in %.0fs (try %d)", exc, delay, tries)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
            tries += 1


def cmd_run(args: argparse.Namespace) -> int:
    conf = config_file.read(args.config)
    settings = dict(conf.settings)
    workers = settings.pop("workers", None)
    if args.workers is not None:
        if args.workers < 1:
            raise ConfigError(f"--workers must be >= 1, not {args.workers}")
        workers = args.workers
    given = {key for key in OPTIONS if getattr(args, key) is not None}
    settings.update({key: getattr(args, key) for key in given})
    check_metrics(settings, given, str(conf.source))  # before a server or worker starts
    app_on_path()
    client = Client(
        resolve(args.redis, config=conf.source, data_dir=args.data_dir, given="--redis"),
        workers,
        prefix=conf.prefix,
        **settings,
    )

    def connect(client: Client) -> None:  # once run() started the first workers
        connect_retrying(client)
        log.info("queasy run: %s on %s", conf.source, mask_url(client.url))

    try:
        for name, (handler, options) in conf.queues.items():
            client.queue(name).listen(handler, **options)
        return client.run(connect)
    finally:
        client.close()


def cmd_server(args: argparse.Namespace) -> int:
    from ..store.shared import serve_foreground

    # the config read as the other commands read it: a typo is ConfigError, not a new dir
    config = args.config or find_pyproject()
    redis = config_table(config).get("redis") if config else None
    if redis is not None:  # the project's commands use that server: this one would serve none
        raise ConfigError(
            f"{config}: redis names {mask_url(str(redis))}: the project's commands use that "
            "server, not the embedded one `queasy server` runs; remove `redis` from the config "
            "to use the embedded server"
        )
    return serve_foreground(data_dir_for(args.data_dir, args.config))


def cmd_dispatch(args: argparse.Namespace) -> int:
    try:
        data = orjson.loads(args.data)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"job data is not JSON: {exc}") from None
    with producer(args) as client:
        print(client.queue(args.queue).dispatch(data, id=args.id, delay=args.delay))
    return exitcodes.OK


def cmd_cancel(args: argparse.Namespace) -> int:
    with producer(args) as client:
        # found as the operator commands find it: a fail queue (`emails-fail`) lives under
        # its owner's hash tag, where client.queue() would look under its own (none there)
        queue = operate.locate(client, args.queue)
        if queue.cancel(args.id):
            job = queue.get_job(args.id)
            if job is not None and job.state == "active":  # singleton by id: its copy
                print(f"cancelled {args.id}: its blocked copy (the job {args.id} that is active "
                      "runs on: an active job is never cancelled)")  # fmt: skip
            else:
                print(f"cancelled {args.id}")
            return exitcodes.OK
        job = queue.get_job(args.id)
    why = f" (it is {job.state})" if job is not None else ""
    print(f"no waiting, delayed or blocked job {args.id} in {args.queue}{why}", file=sys.stderr)
    return exitcodes.NOT_FOUND


def cmd_unschedule(args: argparse.Namespace) -> int:
    with producer(args) as client:
        if client.queue(args.queue).drop_schedule():
            print(f"dropped the schedule of {args.queue}")
            return exitcodes.OK
    print(f"queue {args.queue} has no schedule", file=sys.stderr)
    return exitcodes.NOT_FOUND


COMMANDS = {
    "run": cmd_run,
    "server": cmd_server,
    "dispatch": cmd_dispatch,
    "cancel": cmd_cancel,
    "unschedule": cmd_unschedule,
    "history": history.run,
    **dict.fromkeys(operate.NAMES, lambda args: operate.run(args, producer)),
    "dashboard": dashboard.run,
}
ERRORS: list[tuple[type[BaseException], int]] = [
    (HandlerError, exitcodes.HANDLER),
    (ConfigError, exitcodes.CONFIG),
    (InvalidInput, exitcodes.CONFIG),
    (ConnectionFailed, exitcodes.CONNECT),
    (VersionMismatch, exitcodes.VERSION),
    (JobNotFound, exitcodes.NOT_FOUND),
    (operate.QueueNotFound, exitcodes.NOT_FOUND),
    (QueasyError, exitcodes.FAILURE),
]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # the supervisor's workers log at this level too, in this format (runtime.pool)
    logging.basicConfig(level=args.log_level, format=defaults.LOG_FORMAT)
    try:
        return COMMANDS[args.command](args)
    except QueasyError as exc:
        code = next(code for kind, code in ERRORS if isinstance(exc, kind))
        if "Functions" in str(exc):
            code = exitcodes.VERSION
        log.error("%s", exc)
        return code
    except KeyboardInterrupt:  # Ctrl-C before a supervisor took over the signals
        log.warning("interrupted: queasy %s stopped", args.command)
        return exitcodes.INTERRUPTED
    except Exception as exc:
        # the server's error reply to a command (OOM, MISCONF on a full disk, READONLY on a
        # replica, ...): one line, not a traceback. redis-py is imported only when used:
        # an error of its classes means it was.
        redis = sys.modules.get("redis")
        if redis is None or not isinstance(exc, redis.RedisError):
            raise
        connection = isinstance(exc, (redis.ConnectionError, redis.TimeoutError))
        log.error("Redis: %s (%s)", exc, type(exc).__name__)
        return exitcodes.CONNECT if connection else exitcodes.FAILURE


if __name__ == "__main__":
    sys.exit(main())
