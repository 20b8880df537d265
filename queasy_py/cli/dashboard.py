"""`queasy dashboard`: the web dashboard (the `web` extra), on the server and prefix `queasy
run` would use."""

from __future__ import annotations

import argparse
import logging
import os

from .. import defaults
from ..errors import ConfigError
from ..store.connection import mask_url
from . import exitcodes

log = logging.getLogger("queasy_py")


def add_parser(sub: argparse._SubParsersAction, parents: list, server_options: object) -> None:
    dash = sub.add_parser(
        "dashboard", parents=parents, help="serve the web dashboard (the `web` extra)"
    )
    dash.add_argument(
        "--host",
        default=defaults.DASHBOARD_HOST,
        help=f"address to listen on (default {defaults.DASHBOARD_HOST}; any address that is "
        "not loopback needs a token)",
    )
    dash.add_argument(
        "--port", type=int, default=defaults.DASHBOARD_PORT,
        help=f"port (default {defaults.DASHBOARD_PORT}; 0: any free port)",
    )  # fmt: skip
    dash.add_argument(
        "--read-only", action="store_true", help="show, never act: no requeue, cancel or purge"
    )
    dash.add_argument(
        "--token",
        help=f"required of every request (default ${defaults.DASHBOARD_TOKEN_ENV}; prefer it: "
        "a flag shows in the process list); at least 16 characters",
    )
    server_options(dash, config=True)  # type: ignore[operator]


def run(args: argparse.Namespace) -> int:
    from .main import producer

    token = args.token or os.environ.get(defaults.DASHBOARD_TOKEN_ENV) or None
    from ..web.security import check_bind

    check_bind(args.host, token)  # before anything starts: one line, exit CONFIG
    try:
        from ..web import create_app, serve
    except ImportError as exc:
        raise ConfigError(
            f"queasy dashboard needs the web extra: pip install 'queasy_py[web]' ({exc})"
        ) from None
    with producer(args) as client:
        app = create_app(client, token=token, read_only=args.read_only)
        mode = "read-only" if args.read_only else "actions on"
        auth = "token required" if token else "no token"

        def listening(url: str) -> None:
            log.info("queasy dashboard on %s (%s, %s) for %s prefix %s",
                     url, mode, auth, mask_url(client.url), client.prefix)  # fmt: skip

        serve(app, args.host, args.port, token, listening)
    return exitcodes.OK
