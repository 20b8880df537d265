"""A round whose reply never comes: the loop's connection goes silent (a NAT or firewall that
drops a connection without a reset, a failover that moves the address) while the server and
new connections are fine. The loop waits `LOOP_REDIS_TIMEOUT` at most for a reply (README
"What happens when"), then takes the connection as broken: the round is an outage (its acks
kept and sent again, its dequeue reconciled), not a wait that never ends. Real supervisor and
server, behind a TCP proxy that can black-hole the connections open at a moment.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from lua_calls import live
from proxy import Proxy, shut, through, upstream
from runtime_helpers import Runtime, queue_spec, wait_for


class SilentProxy(Proxy):
    """Forwards one port to the test server; `silence()` drops, from then on, every byte of
    the connections open at that moment (both ways, the sockets kept open: nothing tells
    either end), while connections made afterwards are forwarded as usual."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.generation = 0  # connections of a generation below silenced_below are silent
        self.silenced_below = 0
        self.socks: list[socket.socket] = []
        super().__init__(upstream)

    def silence(self) -> None:
        self.generation += 1
        self.silenced_below = self.generation

    def _forward(self, client: socket.socket, server: socket.socket) -> None:
        gen = self.generation
        self.socks += [client, server]
        threading.Thread(target=self._relay, args=(client, server, gen), daemon=True).start()
        threading.Thread(target=self._relay, args=(server, client, gen), daemon=True).start()

    def _relay(self, src: socket.socket, dst: socket.socket, gen: int) -> None:
        try:
            while chunk := src.recv(65536):
                if gen >= self.silenced_below:
                    dst.sendall(chunk)
        except OSError:
            pass
        shut(src, dst)

    def close(self) -> None:
        super().close()
        shut(*self.socks)
        for sock in self.socks:
            sock.close()


@pytest.fixture
def proxy(redis_url: str) -> Iterator[SilentProxy]:
    p = SilentProxy(upstream(redis_url))
    try:
        yield p
    finally:
        p.close()


def test_a_round_whose_reply_never_comes_is_an_outage_not_a_stall(
    proxy: SilentProxy, prefix: str, r: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    # the supervisor goes through the proxy; the producer and the handlers' records do not
    via = through(proxy, redis_url)
    with (
        Runtime(redis_url, prefix, r, tmp_path) as direct,
        Runtime(via, prefix, r, tmp_path, records=(redis_url, r)) as rt,
    ):
        q = direct.queue("q")
        q.dispatch({"tag": "before"})
        sup = rt.start({"q": queue_spec(timeout=30.0)}, workers=1, poll_interval=0.2)
        rt.wait_records(1, "end", tag="before")
        proxy.silence()  # the loop's connection, its heartbeat's and its pub/sub go silent
        ids = q.dispatch_many({"data": {"tag": "after"}} for _ in range(3))
        # without a bound on the wait for a reply, the loop's dequeue round stays in flight
        # for ever: the jobs wait while the supervisor looks alive (its heartbeat reconnects)
        rt.wait_records(3, "end", tag="after", timeout=30.0)
        assert sup.proc.poll() is None, sup.log()
        wait_for(
            lambda: live(q.counts()) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0},
            timeout=15.0,
            what="nothing left active or waiting",
        )
        ended = [e["id"] for e in rt.wait_events("q", 4) if e["outcome"] == "finished"]
        assert sorted(e for e in ended if e in ids) == sorted(ids)
        starts = [rec for rec in rt.records("start") if rec.get("tag") == "after"]
        assert len(starts) == 3, starts  # none ran twice
