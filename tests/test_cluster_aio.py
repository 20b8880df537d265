"""AsyncClient on a real local Redis Cluster (3 primaries, tests/cluster_servers.py): the
producer API on every primary with FCALL routed by the queue's key (no COMMAND GETKEYS),
the library loaded on every primary, and result() woken by the job's sharded channel (a
queue that stores results) or by its outcome event (one that does not)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import queue_spec
from test_cluster import getkeys_calls, spread_queues

from queasy_py import Client, ConnectionFailed
from queasy_py.aio import AsyncClient
from queasy_py.store.library import bundled_version

RETURNS = "tests.runtime_handlers.returns"


@pytest.fixture
def rt(request: Any, redis_url: str, prefix: str, r: Any, tmp_path: Path) -> Iterator[Any]:
    from runtime_helpers import runtime

    with runtime(request, redis_url, prefix, r, tmp_path) as rt:
        yield rt


def test_async_client_works_on_every_primary_without_command_getkeys(local_cluster: Any):
    prefix = f"qa-{uuid.uuid4().hex[:8]}"
    with Client(local_cluster.url, workers=0, prefix=prefix) as sync:
        names = spread_queues(local_cluster, sync)
        owners = {local_cluster.owner(sync.queue(n).keys.base) for n in names}
    assert len(owners) == 3
    for port in local_cluster.ports:  # no library anywhere: ready() loads it on every primary
        local_cluster.node(port).function_flush()

    async def scenario() -> None:
        async with AsyncClient(local_cluster.url, prefix=prefix) as client:
            assert client.library_version == bundled_version()
            before = getkeys_calls(local_cluster)
            for name in names:
                q = client.queue(name)
                await q.dispatch({"n": 1}, id="one")
                await q.dispatch_many([{"data": {"i": i}} for i in range(20)])  # pipelined
                await q.dispatch({"later": True}, id="later", delay=3600)
                info = await q.get_job("one")
                assert info is not None and info.state == "waiting" and info.data == {"n": 1}
                assert (await q.counts())["waiting"] == 21
                assert await q.cancel("one") is True
                assert [e["outcome"] for e in await q.events()] == ["cancelled"]
                assert await q.purge("delayed") == 1
                listed, _ = await q.jobs("waiting", limit=100)
                assert len(listed) == 20
            assert getkeys_calls(local_cluster) == before

    asyncio.run(scenario())
    for port in local_cluster.ports:
        reply = local_cluster.node(port).fcall_ro("queasy_library", 0)
        assert reply.decode().endswith(bundled_version())


def test_async_client_on_an_unreachable_cluster_is_connection_failed():
    url = "redis+cluster://:pw%2Fsecret@127.0.0.1:1,127.0.0.1:2"

    async def connect() -> None:
        async with AsyncClient(url):
            pass

    with pytest.raises(ConnectionFailed, match="Redis Cluster") as err:
        asyncio.run(connect())
    assert "pw" not in str(err.value) and "secret" not in str(err.value)


def test_async_client_with_refused_credentials_is_authentication_failed(local_cluster: Any):
    from queasy_py import AuthenticationFailed

    nodes = ",".join(f"127.0.0.1:{p}" for p in local_cluster.ports)

    async def connect(url: str) -> None:
        async with AsyncClient(url):
            pass

    for credentials in (":wrong-pw-78@", ""):
        with pytest.raises(AuthenticationFailed, match="refused the credentials") as err:
            asyncio.run(connect(f"redis+cluster://{credentials}{nodes}"))
        assert "wrong-pw-78" not in str(err.value)


@pytest.mark.parametrize("rt", ["cluster"], indirect=True)
def test_async_result_on_a_cluster_by_channel_and_by_event(local_cluster: Any, rt: Any):
    stored, plain = spread_queues(local_cluster, rt.queue("x").client, count=2)
    sup = rt.start(
        {stored: queue_spec(RETURNS, store_results=True), plain: queue_spec(RETURNS)},
        workers=1,
    )

    async def scenario() -> list[Any]:
        async with AsyncClient(rt.url, prefix=rt.prefix) as client:
            await client.queue(stored).dispatch({"gate": "s", "value": {"v": 7}}, id="s1")
            await client.queue(plain).dispatch({"gate": "p", "value": 8}, id="p1")
            waits = [
                asyncio.ensure_future(client.queue(stored).result("s1", timeout=30.0)),
                asyncio.ensure_future(client.queue(plain).result("p1", timeout=30.0)),
            ]
            await asyncio.to_thread(rt.wait_records, 2, "start", 30.0)  # both running
            assert not any(w.done() for w in waits)  # waiting for the ends, not returned
            rt.open_gate("s")
            rt.open_gate("p")
            return list(await asyncio.gather(*waits))

    assert asyncio.run(scenario()) == [{"v": 7}, None]  # `plain` stores no result
    assert sup.stop() == 0
