"""A frozen server (SIGSTOP: a stalled VM, swap, a debugger) under a producer: every call of
the producer API gives up within defaults.SOCKET_TIMEOUT with a clear error, whatever
redis-py's own default (none before redis-py 8: a dispatch then waited forever)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from queasy_py import Client, defaults
from queasy_py.aio import AsyncClient
from queasy_py.errors import ConnectionFailed, QueasyError

#: the bound of these tests (seconds); the default is kept larger for slow networks
BOUND = 1.0


@pytest.fixture
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(defaults, "SOCKET_TIMEOUT", BOUND, raising=False)


@contextmanager
def frozen(server: Any) -> Iterator[None]:
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


def test_a_dispatch_to_a_frozen_server_fails_within_the_socket_timeout(
    own_server: Any, short_timeout: None
) -> None:
    with Client(own_server.url, workers=0, prefix="frozen") as client:
        q = client.queue("q")
        q.dispatch({"n": 1}, id="before")  # connected, the library loaded
        with frozen(own_server):
            started = time.monotonic()
            with pytest.raises(QueasyError, match="reply to queasy_dispatch") as caught:
                q.dispatch({"n": 2}, id="frozen")
            took = time.monotonic() - started
        assert BOUND * 0.9 <= took < BOUND + 1.5, f"the dispatch gave up after {took:.2f}s"
        assert "Timeout" in str(caught.value)
        q.dispatch({"n": 3}, id="after")  # the next call has a new connection
        assert q.get_job("after") is not None


def test_an_async_dispatch_to_a_frozen_server_fails_within_the_socket_timeout(
    own_server: Any, short_timeout: None
) -> None:
    import redis

    async def main() -> float:
        async with AsyncClient(own_server.url, prefix="frozen") as client:
            q = client.queue("q")
            await q.dispatch({"n": 1}, id="async-before")
            with frozen(own_server):
                started = time.monotonic()
                with pytest.raises(ConnectionFailed, match=r"redis://:\*\*\*@") as caught:
                    await q.dispatch({"n": 2}, id="async-frozen")
                assert isinstance(caught.value.__cause__, redis.TimeoutError)
                return time.monotonic() - started

    took = asyncio.run(main())
    assert BOUND * 0.9 <= took < BOUND + 1.5, f"the dispatch gave up after {took:.2f}s"


def test_every_producer_connection_has_the_default_socket_timeouts(
    own_server: Any, local_cluster: Any
) -> None:
    """Sync, async, and on a cluster: the connections' own options, not redis-py's."""
    from queasy_py.store.aiocluster import async_cluster_client

    def options(pool: Any) -> tuple[Any, Any]:
        kwargs = pool.connection_kwargs
        return kwargs.get("socket_timeout"), kwargs.get("socket_connect_timeout")

    want = (defaults.SOCKET_TIMEOUT, defaults.CONNECT_TIMEOUT)
    with Client(own_server.url, workers=0, prefix="frozen") as client:
        assert options(client.redis.connection_pool) == want
    aio = AsyncClient(own_server.url, prefix="frozen")
    assert options(aio.redis.connection_pool) == want
    with Client(local_cluster.url, workers=0, prefix="frozen") as client:
        for node in client.redis.get_nodes():
            assert options(node.redis_connection.connection_pool) == want
    rc = async_cluster_client(local_cluster.url)
    assert (
        rc.connection_kwargs["socket_timeout"],
        rc.connection_kwargs["socket_connect_timeout"],
    ) == want
