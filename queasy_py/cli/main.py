"""The `queasy` command: run a supervisor, run a server, dispatch and cancel jobs."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence

import orjson

from .. import defaults
from ..client import Client
from ..errors import (
    AuthenticationFailed,
    ConfigError,
    ConnectionFailed,
    HandlerError,
    InvalidInput,
    QueasyError,
    VersionMismatch,
)
from ..store.connection import mask_url
from . import config as config_file
from . import exitcodes, history

log = logging.getLogger("queasy_py")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="queasy", description=__doc__)
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a supervisor from a TOML config")
    run.add_argument(
        "config", nargs="?", help="TOML file (default: [tool.queasy] in ./pyproject.toml)"
    )
    run.add_argument("--redis", help="Redis URL (overrides the config's `redis`)")
    run.add_argument("--workers", type=int, help="worker processes (overrides `workers`)")

    server = sub.add_parser("server", help="run an embedded Valkey server in the foreground")
    server.add_argument("--port", type=int, default=6379, help="port on 127.0.0.1 (default 6379)")
    server.add_argument("--dir", help="data directory (default: a new one under the state dir)")

    dispatch = sub.add_parser("dispatch", help="dispatch one job")
    dispatch.add_argument("queue")
    dispatch.add_argument("data", help="the job's data as JSON")
    dispatch.add_argument("--id", help="job id (default: generated)")
    dispatch.add_argument("--delay", type=float, help="seconds from now")
    dispatch.add_argument("--redis", help=f"Redis URL (default ${defaults.URL_ENV})")
    dispatch.add_argument("--prefix", default=defaults.PREFIX)

    cancel = sub.add_parser("cancel", help="cancel a waiting, delayed or blocked job")
    cancel.add_argument("queue")
    cancel.add_argument("id")
    cancel.add_argument("--redis", help=f"Redis URL (default ${defaults.URL_ENV})")
    cancel.add_argument("--prefix", default=defaults.PREFIX)
    history.add_parser(sub)
    return parser


def producer_url(arg: str | None) -> str:
    url = arg or os.environ.get(defaults.URL_ENV)
    if not url:
        raise ConfigError(f"give --redis URL or set ${defaults.URL_ENV}")
    return url


def connect_retrying(make: Callable[[], Client]) -> Client:
    """Retry an unreachable server with backoff for RUN_CONNECT_TIMEOUT (not bad credentials)."""
    deadline = time.monotonic() + defaults.RUN_CONNECT_TIMEOUT
    delay = 1.0
    while True:
        try:
            return make()
        except AuthenticationFailed:
            raise
        except ConnectionFailed as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.error("%s; retrying in %.0fs", exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


def cmd_run(args: argparse.Namespace) -> int:
    conf = config_file.read(args.config)
    settings = dict(conf.settings)
    workers = settings.pop("workers", None)
    if args.workers is not None:
        if args.workers < 1:
            raise ConfigError(f"--workers must be >= 1, not {args.workers}")
        workers = args.workers
    client = connect_retrying(
        lambda: Client(args.redis or conf.redis, workers, prefix=conf.prefix, **settings)
    )
    try:
        log.info("queasy run: %s on %s", conf.source, mask_url(client.url))
        for name, (handler, options) in conf.queues.items():
            client.queue(name).listen(handler, **options)
        return client.run()
    finally:
        client.close()


def cmd_server(args: argparse.Namespace) -> int:
    from ..store.embedded import serve_foreground

    return serve_foreground(args.port, args.dir)


def cmd_dispatch(args: argparse.Namespace) -> int:
    try:
        data = orjson.loads(args.data)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"job data is not JSON: {exc}") from None
    with Client(producer_url(args.redis), workers=0, prefix=args.prefix) as client:
        print(client.queue(args.queue).dispatch(data, id=args.id, delay=args.delay))
    return exitcodes.OK


def cmd_cancel(args: argparse.Namespace) -> int:
    with Client(producer_url(args.redis), workers=0, prefix=args.prefix) as client:
        if client.queue(args.queue).cancel(args.id):
            print(f"cancelled {args.id}")
            return exitcodes.OK
    print(f"no waiting, delayed or blocked job {args.id} in {args.queue}", file=sys.stderr)
    return exitcodes.NOT_FOUND


COMMANDS = {
    "run": cmd_run,
    "server": cmd_server,
    "dispatch": cmd_dispatch,
    "cancel": cmd_cancel,
    "history": history.run,
}
ERRORS: list[tuple[type[BaseException], int]] = [
    (HandlerError, exitcodes.HANDLER),
    (ConfigError, exitcodes.CONFIG),
    (InvalidInput, exitcodes.CONFIG),
    (ConnectionFailed, exitcodes.CONNECT),
    (VersionMismatch, exitcodes.VERSION),
    (QueasyError, exitcodes.FAILURE),
]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s",
    )
    try:
        return COMMANDS[args.command](args)
    except QueasyError as exc:
        code = next(code for kind, code in ERRORS if isinstance(exc, kind))
        if "Functions" in str(exc):
            code = exitcodes.VERSION
        log.error("%s", exc)
        return code


if __name__ == "__main__":
    sys.exit(main())
