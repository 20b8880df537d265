"""A minimal RESP client over a raw socket, for the embedded server's start-up and shutdown
checks (no redis-py connection pool, no retries, every call bounded by a timeout)."""

from __future__ import annotations

import socket

_HOST = "127.0.0.1"


def command(
    port: int, *args: str, password: str | None = None, timeout: float = 1.0
) -> tuple[bytes, bytes]:
    """Send one command over RESP (after AUTH when a password is given); return (reply type
    byte, payload) for simple/bulk replies (the AUTH reply when AUTH is refused)."""
    with socket.create_connection((_HOST, port), timeout=timeout) as sock:
        if password is not None:
            sock.sendall(encode("AUTH", password))
            kind, body, _ = reply(sock, b"")
            if kind != b"+":
                return kind, body
        sock.sendall(encode(*args))
        kind, body, _ = reply(sock, b"")
        return kind, body


def encode(*args: str) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(
        b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args
    )


def reply(sock: socket.socket, buf: bytes) -> tuple[bytes, bytes, bytes]:
    """Read one simple/error/integer/bulk reply: (type byte, payload, what follows it)."""
    while b"\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed before a reply")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n")
    kind, body = head[:1], head[1:]
    if kind != b"$" or int(body) < 0:
        return kind, body, rest
    size = int(body)
    while len(rest) < size + 2:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed inside a bulk reply")
        rest += chunk
    return kind, rest[:size], rest[size + 2 :]


def ping(port: int, password: str | None = None) -> bool:
    try:
        return command(port, "PING", password=password, timeout=0.5) == (b"+", b"PONG")
    except (OSError, ValueError):
        return False


def info_server(port: int, password: str | None = None) -> dict[str, str]:
    kind, body = command(port, "INFO", "server", password=password)
    if kind != b"$":
        return {}
    fields = (line.partition(":") for line in body.decode(errors="replace").splitlines())
    return {k: v for k, sep, v in fields if sep}
