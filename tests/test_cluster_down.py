"""A Redis Cluster with one primary down (killed or frozen, not failed over yet) when a client
connects: the client is made, the queues of the other primaries work, and a call of the down
primary's queues fails on its own within the socket timeout (README, Redis Cluster). The
clusters here have a node timeout of a minute, so the cluster does not mark the node failed
(and, with no replica, stop serving every slot) while a test runs."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from cluster_servers import LocalCluster

from queasy_py import Client, ConnectionFailed
from queasy_py.aio import AsyncClient
from queasy_py.store.keys import RegistryKeys

#: the socket timeouts of the frozen test's URL (seconds; the URL's own win over queasy's)
TIMEOUT = 1.5


def queue_on(cluster: LocalCluster, client: Client, port: int) -> str:
    """A queue name whose keys live on the primary on `port`."""
    for i in range(500):
        if cluster.owner(client.queue(f"q{i}").keys.base) == port:
            return f"q{i}"
    raise AssertionError(f"no queue name on {port}")


def prefix_on(cluster: LocalCluster, port: int, on: bool) -> str:
    """A key prefix whose registry of queues (`<prefix>:queues`) lives on the primary on
    `port` (on=True) or on another one."""
    for _ in range(500):
        prefix = f"qd-{uuid.uuid4().hex[:8]}"
        if (cluster.owner(RegistryKeys(prefix).queues) == port) == on:
            return prefix
    raise AssertionError(f"no prefix for {port}")


def stop_node(cluster: LocalCluster, port: int, how: str) -> None:
    proc = cluster.procs[cluster.ports.index(port)]
    if how == "kill":
        proc.kill()
        proc.wait(timeout=10)
    else:
        proc.send_signal(signal.SIGSTOP)
    cluster.down.add(port)


def timed(call: Any) -> tuple[Any, float]:
    start = time.monotonic()
    return call(), time.monotonic() - start


@pytest.mark.parametrize("index", [2, 0], ids=["another_primary", "the_primary_of_slot_0"])
def test_a_client_made_while_a_primary_is_killed_works_on_the_other_primaries(
    cluster: LocalCluster, tmp_path: Path, caplog: Any, index: int
):
    """A primary killed, not failed over: Client.ready() and AsyncClient.ready() ran the
    version handshake on every primary and raised ConnectionFailed, so no call of any queue
    worked (and `queasy dispatch` exited CONNECT for a queue of a live primary too). The
    primary of slot 0 killed (ports[0] here) failed every connect even after that: redis-py
    makes it its default node and sends its first call (COMMAND) there."""
    from test_cli import run_queasy

    from queasy_py.cli import exitcodes

    dead = cluster.ports[index]
    prefix = prefix_on(cluster, dead, on=False)
    stop_node(cluster, dead, "kill")
    client = Client(cluster.url, workers=0, prefix=prefix)
    try:
        other = cluster.ports[1]
        live, down = queue_on(cluster, client, other), queue_on(cluster, client, dead)
        client.ready(attempts=1)
        assert f"127.0.0.1:{dead}" in caplog.text and "does not answer" in caplog.text
        assert cluster.password not in caplog.text
        client.queue(live).dispatch({"n": 1}, id="one")
        assert client.queue(live).get_job("one").data == {"n": 1}  # type: ignore[union-attr]
        with pytest.raises(ConnectionFailed, match=f"127.0.0.1:{dead}") as err:
            client.queue(down).dispatch({"n": 2})  # not redis-py's own error (connfailed.py)
        assert isinstance(err.value.__cause__, redis.ConnectionError)
        assert cluster.password not in str(err.value)
        assert client.queue(live).counts()["waiting"] == 1  # the client still works
    finally:
        client.close()

    async def async_calls() -> None:
        aclient = AsyncClient(cluster.url, prefix=prefix)
        try:
            await aclient.ready()
            await aclient.queue(live).dispatch({"n": 3}, id="three")
            assert (await aclient.queue(live).get_job("three")).data == {"n": 3}  # type: ignore[union-attr]
        finally:
            await aclient.close()

    asyncio.run(async_calls())
    code, out = run_queasy(
        tmp_path, "dispatch", live, "{}", "--redis", cluster.url, "--prefix", prefix
    )
    assert code == 0, out
    code, out = run_queasy(
        tmp_path, "dispatch", down, "{}", "--redis", cluster.url, "--prefix", prefix
    )
    assert code == exitcodes.CONNECT and "Traceback" not in out, out
    assert cluster.password.split("/")[1] not in out


def test_a_client_made_while_a_primary_is_frozen_is_ready_within_one_socket_timeout(
    cluster: LocalCluster,
):
    """A primary frozen (SIGSTOP), not failed over: Client.ready() waited three timeouts and
    raised ConnectionFailed; AsyncClient.ready() retried each handshake call ten times
    (redis-py's default) and raised after 11 timeouts. Each is ready after a timeout or
    two, and a queue of a live primary works."""
    frozen = cluster.ports[1]
    prefix = prefix_on(cluster, frozen, on=False)
    url = f"{cluster.url}?socket_timeout={TIMEOUT}&socket_connect_timeout={TIMEOUT}"
    # redis-py may ask the frozen node for the slot map first (it shuffles the nodes): a few
    # timeouts at most, not the 11 of redis-py's retries
    bound = 4 * TIMEOUT + 1.0
    client = Client(url, workers=0, prefix=prefix)
    try:
        live = queue_on(cluster, client, cluster.ports[0])
        stop_node(cluster, frozen, "stop")
        _, took = timed(lambda: client.ready(attempts=1))
        assert took < bound, took
        client.queue(live).dispatch({"n": 1}, id="one")
        assert client.queue(live).get_job("one").data == {"n": 1}  # type: ignore[union-attr]
    finally:
        client.close()

    async def async_calls() -> float:
        aclient = AsyncClient(url, prefix=prefix)
        try:
            start = time.monotonic()
            await aclient.ready()
            took = time.monotonic() - start
            await aclient.queue(live).dispatch({"n": 2}, id="two")
            assert (await aclient.queue(live).get_job("two")).data == {"n": 2}  # type: ignore[union-attr]
            return took
        finally:
            await aclient.close()

    took = asyncio.run(async_calls())
    assert took < bound, took


def test_a_client_still_fails_when_no_primary_answers(cluster: LocalCluster):
    """Every primary down: ConnectionFailed naming the masked URL, as before."""
    for port in list(cluster.ports):
        stop_node(cluster, port, "kill")
    client = Client(cluster.url, workers=0)
    try:
        with pytest.raises(ConnectionFailed, match="Redis Cluster") as err:
            client.ready(attempts=1)
        assert "***@127.0.0.1" in str(err.value) and cluster.password not in str(err.value)
    finally:
        client.close()


def test_dispatch_goes_on_when_the_registry_of_queues_is_on_the_down_primary(
    cluster: LocalCluster, caplog: Any
):
    """The registry of queues (`<prefix>:queues`, one key) lives on one primary, and each
    queue's first dispatch wrote to it first: with that primary killed, the first dispatch of
    every queue raised, those of the live primaries too; with it frozen, each waited a
    socket timeout and raised. The dispatch goes on unregistered (a WARNING) and the write is
    tried again after REGISTRY_RETRY."""
    from queasy_py import defaults

    dead, frozen = cluster.ports[2], cluster.ports[1]
    prefix = prefix_on(cluster, dead, on=True)
    stop_node(cluster, dead, "kill")
    client = Client(cluster.url, workers=0, prefix=prefix)
    try:
        live = queue_on(cluster, client, cluster.ports[0])
        client.queue(live).dispatch({"n": 1}, id="one")
        assert client.queue(live).get_job("one").data == {"n": 1}  # type: ignore[union-attr]
        assert "the registry of queues" in caplog.text and prefix in caplog.text
        assert client.queue(live).register_after > time.monotonic() + 0.5 * defaults.REGISTRY_RETRY
    finally:
        client.close()

    async def async_dispatch() -> None:
        aclient = AsyncClient(cluster.url, prefix=prefix)
        try:
            await aclient.queue(live).dispatch({"n": 2}, id="two")
            assert (await aclient.queue(live).get_job("two")).data == {"n": 2}  # type: ignore[union-attr]
        finally:
            await aclient.close()

    asyncio.run(async_dispatch())

    # frozen: one socket timeout for the first dispatch, none for the next ones
    prefix = prefix_on(cluster, frozen, on=True)
    url = f"{cluster.url}?socket_timeout={TIMEOUT}&socket_connect_timeout={TIMEOUT}"
    client = Client(url, workers=0, prefix=prefix)
    try:
        live = queue_on(cluster, client, cluster.ports[0])
        client.ready()
        stop_node(cluster, frozen, "stop")
        _, first = timed(lambda: client.queue(live).dispatch({"n": 3}))
        _, then = timed(lambda: [client.queue(live).dispatch({"n": i}) for i in range(10)])
        assert first < 2 * TIMEOUT and then < TIMEOUT, (first, then)
        assert client.queue(live).counts()["waiting"] == 11
    finally:
        client.close()
