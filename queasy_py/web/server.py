"""Serving the dashboard: the listening socket (bound here, so that a port in use is one clear
error and port 0 picks a free one) and uvicorn on it, without access logs (a `?token=` in a
URL must never reach a log)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

from .. import defaults
from ..errors import ConfigError
from .security import check_bind, is_loopback

log = logging.getLogger("queasy_py")


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (ConfigError when it cannot be had)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"--port must be 0..65535, not {port!r}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def serve(
    app: Any,
    host: str,
    port: int,
    token: str | None,
    on_listen: Callable[[str], None] | None = None,
) -> None:
    """Serve `app` on host:port until SIGINT/SIGTERM (the bind rules of check_bind first)."""
    import uvicorn

    check_bind(host, token)
    sock = listen_socket(host, port)
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    url = f"http://{shown}:{bound[1]}/"
    if on_listen is not None:
        on_listen(url)
    if not is_loopback(host):
        log.warning(
            "the dashboard listens on %s: its token travels in clear over plain HTTP; put it "
            "behind a TLS proxy (or an SSH tunnel) on an untrusted network",
            host,
        )
    config = uvicorn.Config(
        app,
        http=timed_protocol(),
        log_config=None,
        access_log=False,
        server_header=False,
        lifespan="off",
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()


def timed_protocol() -> type:
    """uvicorn's h11 protocol that closes a connection whose client has not sent a whole
    request (head and body) DASHBOARD_CLIENT_TIMEOUT seconds after it connected or after the
    previous reply: uvicorn alone holds an idle or dribbling connection for ever (its
    keep-alive timer starts at a reply, and any byte stops it), so a few hundred of them
    would spend the dashboard's file descriptors."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedProtocol(H11Protocol):
        request_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self.request_timer = self.loop.call_later(
                defaults.DASHBOARD_CLIENT_TIMEOUT, self._request_due
            )

        def _disarm(self) -> None:
            if self.request_timer is not None:
                self.request_timer.cancel()
                self.request_timer = None

        def _request_due(self) -> None:
            self.request_timer = None
            # no reply started (the request is not in) or one sent before the request's body
            # was read (a 404, a refusal): the client still owes a body it is not sending
            waiting = self.conn.our_state in (h11.IDLE, h11.DONE)
            if waiting and self.conn.their_state is not h11.DONE:
                self.transport.close()

    return TimedProtocol
