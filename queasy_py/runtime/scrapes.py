"""The HTTP serving of /metrics (runtime/prometheus.py's WSGI app), bounded for a supervisor's
process whatever its clients do: one thread runs an asyncio loop that accepts connections and
reads their request heads, a fixed pool of METRICS_SCRAPES threads builds the replies (the
collector blocks on Redis), and the loop writes them back.

A client has METRICS_CLIENT_TIMEOUT seconds to send its whole request head (a slow or idle
one is closed, however it dribbles) and as long to read the reply; a head over
METRICS_HEAD_BYTES is answered 431; at most METRICS_CONNECTIONS connections are held (a new
one past it closes the oldest still sending its head, or itself when none is). Each reply
closes its connection (no keep-alive), as the prometheus_client server did.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import queue
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from .. import defaults

log = logging.getLogger("queasy_py")

#: a WSGI app (prometheus_client's make_wsgi_app)
App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
#: a reply: status line's code and reason, headers, body
Reply = tuple[str, list[tuple[str, str]], bytes]


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (OSError when it cannot be had). An IPv6 address
    serves IPv4 too where the system allows it ('::': every address of both, as
    prometheus_client's server and the dashboard do): socket.create_server alone would set
    IPV6_V6ONLY."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    dual = family == socket.AF_INET6 and socket.has_dualstack_ipv6()
    return socket.create_server(address[:2], family=family, backlog=128, dualstack_ipv6=dual)


def bind_problem(exc: OSError, host: str, port: int) -> str:
    """What bind(host, port) failing with `exc` means, for the ConfigError that says it."""
    if exc.errno == errno.EADDRINUSE:
        return (
            f"metrics port {port} on {host} is in use (each supervisor on a host needs its "
            "own metrics_port; 0 picks a free one)"
        )
    return f"cannot serve metrics on {host}:{port}: {exc}"


class ScrapeServer:
    """Serves `app` on a bound socket from one loop thread and a fixed pool (see the module)."""

    def __init__(self, app: App, sock: socket.socket) -> None:
        self.app = app
        self.sock = sock
        self.port: int = sock.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.reading: dict[asyncio.StreamWriter, None] = {}  # oldest first
        self.open: set[asyncio.StreamWriter] = set()
        started = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(started,), name="queasy-metrics", daemon=True
        )
        self.pool = [
            threading.Thread(target=self._answer_loop, name=f"queasy-scrape-{i}", daemon=True)
            for i in range(defaults.METRICS_SCRAPES)
        ]
        for thread in (self.thread, *self.pool):
            thread.start()
        started.wait()

    def close(self) -> None:
        """Stop serving: close every connection and the socket, end the threads."""
        with contextlib.suppress(RuntimeError):  # the loop already closed
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5.0)
        for _ in self.pool:
            self.jobs.put(None)

    def _run(self, started: threading.Event) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(
            asyncio.start_server(self._serve, sock=self.sock, limit=defaults.METRICS_HEAD_BYTES)
        )
        started.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            # until none is left: a connection accepted meanwhile starts one more
            while tasks := [task for task in asyncio.all_tasks(loop) if not task.done()]:
                for writer in list(self.open):
                    writer.transport.abort()
                for _ in range(2):  # each task steps into _serve's try (a task cancelled
                    loop.run_until_complete(asyncio.sleep(0))  # before it ran logs as one)
                for task in tasks:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open.add(writer)
        self.reading[writer] = None
        if len(self.open) > defaults.METRICS_CONNECTIONS:
            oldest = next(iter(self.reading))  # this one when no other is still reading
            del self.reading[oldest]
            oldest.transport.abort()
        timeout = defaults.METRICS_CLIENT_TIMEOUT
        try:
            try:
                async with asyncio.timeout(timeout):  # no inner task left to log at close
                    head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError:
                reply: Reply = ("431 Request Header Fields Too Large", [], b"")
            else:
                environ = parse(head)
                if environ is None:
                    reply = ("400 Bad Request", [], b"")
                else:
                    self.reading.pop(writer, None)
                    answer: asyncio.Future[Reply] = self.loop.create_future()
                    self.jobs.put((environ, answer))
                    reply = await answer
            self.reading.pop(writer, None)
            writer.write(encode(reply))
            writer.close()  # once the reply is sent, which the client has `timeout` to read
            async with asyncio.timeout(timeout):
                await writer.wait_closed()
        except (asyncio.IncompleteReadError, OSError):  # TimeoutError and ConnectionError too
            writer.transport.abort()  # gone, idle, too slow or refused: nothing to answer
        except asyncio.CancelledError:  # close(): ended quietly (3.11's start_server logs a
            writer.transport.abort()  # cancelled connection task as an unhandled error)
        finally:
            self.reading.pop(writer, None)
            self.open.discard(writer)

    def _answer_loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            environ, answer = job
            reply = self._answer(environ)
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self.loop.call_soon_threadsafe(_settle, answer, reply)

    def _answer(self, environ: dict[str, Any]) -> Reply:
        started: list[Any] = []
        try:
            body = b"".join(
                self.app(environ, lambda status, headers, *_: started.extend((status, headers)))
            )
            return started[0], list(started[1]), body
        except Exception as exc:  # a collector's bug: this scrape fails, the next may not
            log.warning("metrics: scrape failed: %r", exc)
            return "500 Internal Server Error", [], b""


def _settle(answer: asyncio.Future[Reply], reply: Reply) -> None:
    if not answer.done():  # not cancelled (the connection's task ended at close)
        answer.set_result(reply)


def parse(head: bytes) -> dict[str, Any] | None:
    """The WSGI environ of a request head (the headers the app reads), None when malformed."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    method, target, _ = parts
    try:
        url = urlsplit(target)
    except ValueError:  # an unclosed '[' of an IPv6 host, say
        return None
    environ = {"REQUEST_METHOD": method, "PATH_INFO": url.path, "QUERY_STRING": url.query}
    for line in lines[1:]:
        name, colon, field = line.partition(":")
        if not colon:
            continue
        key = name.strip().upper().replace("-", "_")
        if key in ("ACCEPT", "ACCEPT_ENCODING"):
            environ[f"HTTP_{key}"] = field.strip()
    return environ


def encode(reply: Reply) -> bytes:
    status, headers, body = reply
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers)]
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body
