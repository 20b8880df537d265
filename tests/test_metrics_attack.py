"""/metrics of a real supervisor under hostile local clients: many idle connections, a
request head sent a byte at a time, a huge request head. The supervisor's process keeps a
bounded number of threads and open connections, and a real scrape still answers in time."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from runtime_helpers import ACT, Runtime, queue_spec, wait_for
from test_metrics import metrics_port, scrape, value

from queasy_py import defaults

#: the most threads a supervisor may add while its /metrics is attacked (its scrape pool)
EXTRA_THREADS = defaults.METRICS_SCRAPES + 2


@pytest.fixture
def rt(redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(redis_url, prefix, r, tmp_path) as runtime:
        yield runtime


@contextlib.contextmanager
def idle_connections(port: int, n: int) -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        yield socks
    finally:
        for sock in socks:
            sock.close()


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes `sock` (EOF or reset) within `within` seconds."""
    sock.settimeout(max(within, 0.01))
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def timed_scrape(port: int) -> tuple[float, dict]:
    start = time.monotonic()
    samples = scrape(port)
    return time.monotonic() - start, samples


def test_many_idle_connections_start_no_threads_and_a_scrape_still_answers(
    rt: Runtime,
) -> None:
    """200 idle connections to /metrics: the supervisor's threads stay bounded (not one per
    connection), a real scrape answers within a second, and the idle connections are all
    closed by the server by METRICS_CLIENT_TIMEOUT (those over METRICS_CONNECTIONS at once)."""
    sup = rt.start({"q": queue_spec(ACT)}, workers=1, metrics_port=0)
    port = metrics_port(sup.log)
    scrape(port)
    before = psutil.Process(sup.pid).num_threads()
    with idle_connections(port, 200) as socks:
        took, samples = timed_scrape(port)  # accepted after the 200: they were all seen
        assert value(samples, "queasy_workers") == 1
        assert took < 1.0
        threads = psutil.Process(sup.pid).num_threads()
        assert threads <= before + EXTRA_THREADS, (before, threads)
        deadline = time.monotonic() + defaults.METRICS_CLIENT_TIMEOUT + 2.0
        for sock in socks:
            assert closed_by_server(sock, deadline - time.monotonic())
    assert psutil.Process(sup.pid).num_threads() <= before + EXTRA_THREADS
    assert sup.stop() == 0


def test_a_request_head_sent_a_byte_at_a_time_is_closed_at_the_client_timeout(
    rt: Runtime,
) -> None:
    """Slowloris: a client that keeps sending its head a byte every 0.2 s (each read on time)
    is closed METRICS_CLIENT_TIMEOUT after it connected, not held while it dribbles."""
    sup = rt.start({"q": queue_spec(ACT)}, workers=1, metrics_port=0)
    port = metrics_port(sup.log)
    head = b"GET /metrics HTTP/1.1\r\n" + b"X-Slow: " + b"a" * 1000
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        start = time.monotonic()
        closed = False
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # reset: closed by the server
                closed = True
                break
            if closed_by_server(sock, 0.2):
                closed = True
                break
            if time.monotonic() - start > defaults.METRICS_CLIENT_TIMEOUT + 3.0:
                break
        took = time.monotonic() - start
    assert closed, f"still open after {took:.1f} s"
    assert defaults.METRICS_CLIENT_TIMEOUT - 0.5 <= took <= defaults.METRICS_CLIENT_TIMEOUT + 2
    assert value(scrape(port), "queasy_workers") == 1
    assert sup.stop() == 0


def test_a_huge_request_head_is_answered_431_and_closed(rt: Runtime) -> None:
    sup = rt.start({"q": queue_spec(ACT)}, workers=1, metrics_port=0)
    port = metrics_port(sup.log)
    head = b"GET /metrics HTTP/1.1\r\n" + b"X-Big: " + b"a" * (4 * defaults.METRICS_HEAD_BYTES)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with contextlib.suppress(OSError):  # reset once the server has answered and closed
            sock.sendall(head)
        reply = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(4096):
                reply += chunk
    assert reply.startswith(b"HTTP/1.1 431 "), reply[:100]
    assert value(scrape(port), "queasy_workers") == 1
    assert sup.stop() == 0


def test_a_request_target_urlsplit_refuses_is_answered_400_not_a_traceback(
    rt: Runtime,
) -> None:
    """`GET http://[::1 HTTP/1.1` (an unclosed IPv6 bracket: urlsplit raises ValueError) is
    bad input like any malformed head: answered 400, with no traceback in the supervisor's
    log (any local client could fill it), and the next scrape answers."""
    sup = rt.start({"q": queue_spec(ACT)}, workers=1, metrics_port=0)
    port = metrics_port(sup.log)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET http://[::1/metrics HTTP/1.1\r\n\r\n")
        reply = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(4096):
                reply += chunk
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:100]
    assert value(scrape(port), "queasy_workers") == 1
    assert "Traceback" not in sup.log()
    assert sup.stop() == 0


def test_metrics_host_any_ipv6_address_also_answers_ipv4_scrapes(rt: Runtime) -> None:
    """metrics_host '::' (every address) serves IPv4 clients too, as prometheus_client's
    server did and as the dashboard's '::' does (IPV6_V6ONLY off): a scrape of 127.0.0.1
    and one of ::1 both answer."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    sup = rt.start({"q": queue_spec(ACT)}, workers=1, metrics_port=0, metrics_host="::")
    port = int(
        wait_for(
            lambda: re.search(r"metrics on http://\[::\]:(\d+)/metrics", sup.log()),
            what="the metrics line",
        )[1]
    )
    with socket.create_connection(("::1", port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        assert sock.recv(16).startswith(b"HTTP/1.1 200")
    assert value(scrape(port), "queasy_workers") == 1  # 127.0.0.1
    assert sup.stop() == 0


def test_scrapes_in_flight_while_the_supervisor_stops_log_no_error(rt: Runtime) -> None:
    """Clients scraping without pause while the supervisor stops: it exits 0 at once, and
    the connections its close() ends are ended quietly (no 'Exception in callback',
    'Task was destroyed but it is pending', no traceback at ERROR in its log)."""
    sup = rt.start({"q": queue_spec(ACT)}, workers=1, metrics_port=0)
    port = metrics_port(sup.log)
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                    sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
                    sock.recv(10)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)
        assert sup.stop() == 0
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert "Traceback" not in sup.log()
