"""`queasy run`'s metrics address, checked before anything is started (the embedded server,
the workers): a bad --metrics-port or --metrics-host (or `metrics_port`/`metrics_host` of
the config) is one ConfigError naming the option and its value, exit code CONFIG."""

from __future__ import annotations

import errno
import importlib.util
import socket
from typing import Any

from ..errors import ConfigError, InvalidInput
from ..options import check_setting

#: the command-line option of each setting
OPTIONS = {"metrics_port": "--metrics-port", "metrics_host": "--metrics-host"}


def check_metrics(settings: dict[str, Any], given: set[str], source: str) -> None:
    """Check the metrics settings `queasy run` will use (`given`: those from the command
    line; the others are the config file's, `source`): their values, then that prometheus-
    client is installed and host:port can be bound now (the socket is closed again)."""

    def named(key: str) -> str:
        return OPTIONS[key] if key in given else f"{source}: {key}"

    for key in OPTIONS:
        if key in settings:
            try:
                check_setting(key, settings[key])
            except InvalidInput as exc:
                raise ConfigError(f"{named(key)} {settings[key]!r}: {exc}") from None
    port = settings.get("metrics_port")
    if port is None:
        return
    if importlib.util.find_spec("prometheus_client") is None:
        raise ConfigError(
            f"{named('metrics_port')} {port!r} needs prometheus-client: "
            "pip install 'queasy_py[metrics]'"
        )
    from ..defaults import SUPERVISOR

    host = settings.get("metrics_host", SUPERVISOR["metrics_host"])
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        raise ConfigError(
            f"{named('metrics_host')} {host!r}: not a host name or address this machine "
            f"can serve on ({exc})"
        ) from None
    from ..runtime.scrapes import bind, bind_problem  # the supervisor's own bind

    try:
        bind(host, port).close()
    except OSError as exc:
        what = f"{named('metrics_port')} {port!r}"
        if exc.errno != errno.EADDRINUSE:
            what = f"{named('metrics_host')} {host!r} / {what}"
        raise ConfigError(f"{what}: {bind_problem(exc, host, port)}") from None
