"""A minimal RESP client over a raw socket, for the embedded server's start-up and shutdown
checks (no redis-py connection pool, no retries, every call bounded by a timeout)."""

from __future__ import annotations

import socket

_HOST = "127.0.0.1"


def _connect(address: int | str, timeout: float) -> socket.socket:
    """A connection to port `address` of 127.0.0.1, or to the unix socket at path `address`."""
    if isinstance(address, int):
        return socket.create_connection((_HOST, address), timeout=timeout)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def command(
    address: int | str, *args: str, password: str | None = None, timeout: float = 1.0
) -> tuple[bytes, bytes]:
    """Send one command over RESP (after AUTH when a password is given) to a port of 127.0.0.1
    or a unix socket path; return (reply type byte, payload) for simple/bulk replies (the AUTH
    reply when AUTH is refused)."""
    with _connect(address, timeout) as sock:
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


def ping(address: int | str, password: str | None = None) -> bool:
    try:
        return command(address, "PING", password=password, timeout=0.5) == (b"+", b"PONG")
    except (OSError, ValueError):
        return False


def ping_answer(
    address: int | str, password: str | None = None, timeout: float = 0.5
) -> str | None:
    """What the server answers PING with: "PONG", or an error ("MISCONF Errors writing to the
    AOF file: ..." on a full disk, "LOADING ..."); None when it does not answer."""
    try:
        answer = command(address, "PING", password=password, timeout=timeout)[1]
        return answer.decode(errors="replace")
    except (OSError, ValueError):
        return None


#: seconds a loading server has to answer: it reads its sockets only between batches of the
#: data it loads (valkey: every 1024 commands of an append-only file), and the answer takes
#: three of them (connect, AUTH, PING); on a loaded machine 0.5 s was not always enough, and
#: a server loading its data was killed for it
LOADING_PROBE_TIMEOUT = 2.0


def info_server(address: int | str, password: str | None = None) -> dict[str, str]:
    kind, body = command(address, "INFO", "server", password=password)
    if kind != b"$":
        return {}
    fields = (line.partition(":") for line in body.decode(errors="replace").splitlines())
    return {k: v for k, sep, v in fields if sep}
