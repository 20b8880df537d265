"""The producer API on a Redis Cluster whose primaries come and go (the `cluster` fixture:
3 primaries, no replica, a node timeout of a minute: nothing is failed over).

- A primary down when the client connected (passed over with a WARNING) is version-checked
  before the first call of its queues once it answers, and a primary that lost the library
  (restarted empty, FUNCTION FLUSH) gets it again from the call that finds it gone, which
  is sent again (store/cluster.ClusterClient, store/aiocluster.AsyncClusterClient): they
  raised redis-py's "Function not found", while the supervisor reloads it on its own.
- redis-py's RedisClusterException when no node answers, or when the slot map read again
  lacks a slot, is ConnectionFailed naming the call and the masked URL (connfailed.py), as
  every other lost server is.
- requeue_failed() takes its cutoff from the TIME of the queue's own primary, not of
  redis-py's default node (which may be down, or its clock another).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis
from cluster_servers import LocalCluster
from lua_calls import NOW, Lua, schedule
from redis.exceptions import ClusterDownError, RedisClusterException
from runtime_helpers import wait_for
from test_cluster_down import prefix_on, queue_on, stop_node
from test_lua import load_version

from queasy_py import Client, ConnectionFailed, VersionMismatch
from queasy_py.aio import AsyncClient
from queasy_py.reach import Reach, Unreachable
from queasy_py.store.keys import RegistryKeys
from queasy_py.store.library import bundled_version, parse_version

SYNC_ASYNC = ["sync", "async"]


def restart_empty(cluster: LocalCluster, port: int) -> None:
    """Start the killed node on `port` again: its identity and slots (nodes.conf), no data
    and no function library (no persistence); wait until the cluster is ok there."""
    cluster.procs[cluster.ports.index(port)] = cluster._spawn(port)
    cluster.down.discard(port)

    def ok() -> bool:
        try:
            return b"cluster_state:ok" in cluster.node(port).execute_command("CLUSTER", "INFO")
        except redis.ConnectionError:
            return False

    wait_for(ok, 30.0, f"the node on {port} to serve its slots again")


def lua_on(cluster: LocalCluster, port: int, prefix: str, name: str) -> Lua:
    """The library's raw calls on queue `name`, sent to its primary (replies as text)."""
    node = redis.Redis(port=port, password=cluster.password, decode_responses=True)
    return Lua(node, prefix, name)


def library_on(cluster: LocalCluster, port: int) -> str | None:
    try:
        return cluster.node(port).fcall_ro("queasy_library", 0).decode()
    except redis.ResponseError:
        return None


def run_flavor(flavor: str, url: str, prefix: str, calls: Callable[[Any], Any]) -> Any:
    """`calls(client)` on a sync Client, or awaited on an AsyncClient (made the same way)."""
    if flavor == "sync":
        with Client(url, workers=0, prefix=prefix) as client:
            return calls(client)

    async def scenario() -> Any:
        async with AsyncClient(url, prefix=prefix) as client:
            return await calls(client)

    return asyncio.run(scenario())


# ------------------------------------------------------------------ the library gone


@pytest.mark.parametrize("flavor", SYNC_ASYNC)
def test_a_primary_passed_over_at_connect_and_back_empty_gets_the_library(
    cluster: LocalCluster, caplog: Any, flavor: str
):
    """A primary killed when the client connected, then started again empty: the client
    never checked it, and every call of its queues raised "Function not found"."""
    dead = cluster.ports[2]
    prefix = prefix_on(cluster, dead, on=False)
    with Client(cluster.url, workers=0, prefix=prefix) as probe:
        name = queue_on(cluster, probe, dead)  # (the library loaded everywhere)
    stop_node(cluster, dead, "kill")

    if flavor == "sync":
        client: Any = Client(cluster.url, workers=0, prefix=prefix)
        client.ready(attempts=1)
    else:
        client = AsyncClient(cluster.url, prefix=prefix)
        loop = asyncio.new_event_loop()
        loop.run_until_complete(client.ready())
    try:
        assert f"127.0.0.1:{dead}" in caplog.text and "does not answer" in caplog.text
        restart_empty(cluster, dead)
        assert library_on(cluster, dead) is None
        q = client.queue(name)
        if flavor == "sync":
            q.dispatch({"n": 1}, id="one")
            assert q.dispatch_many([{"data": {"n": 2}, "id": "two"}]) == ["two"]
            info = q.get_job("one")
        else:
            loop.run_until_complete(q.dispatch({"n": 1}, id="one"))
            ids = loop.run_until_complete(q.dispatch_many([{"data": {"n": 2}, "id": "two"}]))
            assert ids == ["two"]
            info = loop.run_until_complete(q.get_job("one"))
        assert info is not None and info.data == {"n": 1} and info.state == "waiting"
        assert library_on(cluster, dead) == f"queasy_py {bundled_version()}"
        assert cluster.password not in caplog.text
    finally:
        if flavor == "sync":
            client.close()
        else:
            loop.run_until_complete(client.close())
            loop.close()


@pytest.mark.parametrize("flavor", SYNC_ASYNC)
@pytest.mark.parametrize("call", ["dispatch", "dispatch_many", "get_job", "counts"])
def test_a_call_that_finds_the_library_gone_loads_it_and_is_sent_again(
    cluster: LocalCluster, caplog: Any, flavor: str, call: str
):
    """Every primary checked at connect, then one flushed (as one restarted empty, or a node
    that took its slots, has none): the calls of its queues raised "Function not found"."""
    port = cluster.ports[1]
    prefix = prefix_on(cluster, port, on=False)
    with Client(cluster.url, workers=0, prefix=prefix) as probe:
        name = queue_on(cluster, probe, port)
        probe.queue(name).dispatch({"n": 0}, id="zero")

    def flushed_then(client: Any) -> Any:
        cluster.node(port).function_flush()
        q = client.queue(name)
        return {
            "dispatch": lambda: q.dispatch({"n": 1}, id="one"),
            "dispatch_many": lambda: q.dispatch_many([{"data": {"n": 1}, "id": "one"}]),
            "get_job": lambda: q.get_job("zero"),
            "counts": lambda: q.counts(),
        }[call]()

    got = run_flavor(flavor, cluster.url, prefix, flushed_then)
    assert got is not None
    assert library_on(cluster, port) == f"queasy_py {bundled_version()}"
    assert f"library is gone on Redis Cluster primary 127.0.0.1:{port}" in caplog.text
    with Client(cluster.url, workers=0, prefix=prefix) as client:
        assert client.queue(name).counts()["waiting"] == (1 if call in ("get_job", "counts") else 2)


@pytest.mark.parametrize("flavor", SYNC_ASYNC)
def test_a_newer_major_library_on_a_primary_back_is_refused_as_at_connect(
    cluster: LocalCluster, flavor: str
):
    """A primary passed over at connect comes back holding a newer major library (its
    functions all there): its calls ran on it unchecked; the handshake refuses it first."""
    dead = cluster.ports[2]
    prefix = prefix_on(cluster, dead, on=False)
    with Client(cluster.url, workers=0, prefix=prefix) as probe:
        name = queue_on(cluster, probe, dead)
    stop_node(cluster, dead, "kill")
    newer = f"{parse_version(bundled_version())[0] + 1}.0.0"

    def back_newer_then(client: Any) -> Any:
        restart_empty(cluster, dead)
        load_version(cluster.node(dead), newer)
        return client.queue(name).dispatch({"n": 1})

    with pytest.raises(VersionMismatch, match=newer):
        run_flavor(flavor, cluster.url, prefix, back_newer_then)
    assert library_on(cluster, dead) == f"queasy_py {newer}"  # never replaced
    assert cluster.node(dead).dbsize() == 0  # nothing written


@pytest.mark.parametrize("flavor", SYNC_ASYNC)
def test_a_foreign_library_found_by_a_gone_call_is_refused_as_at_connect(
    cluster: LocalCluster, flavor: str
):
    """The call that finds its function gone meets a library named 'queasy' that is not
    queasy_py's: VersionMismatch (the handshake's), the library kept."""
    from test_lua import FOREIGN_WITHOUT_VERSION

    port = cluster.ports[0]
    prefix = prefix_on(cluster, port, on=False)
    with Client(cluster.url, workers=0, prefix=prefix) as probe:
        name = queue_on(cluster, probe, port)

    def foreign_then(client: Any) -> Any:
        cluster.node(port).function_load(FOREIGN_WITHOUT_VERSION, replace=True)
        return client.queue(name).dispatch({"n": 1})

    with pytest.raises(VersionMismatch, match="not queasy_py's"):
        run_flavor(flavor, cluster.url, prefix, foreign_then)
    assert cluster.node(port).function_list(library="queasy")  # kept, never replaced


# ------------------------------------------------------------------ RedisClusterException


#: a call of each kind: FCALL on the fast path, a pipeline, FCALL_RO
CALLS: dict[str, Callable[[Any], Any]] = {
    "dispatch": lambda q: q.dispatch({"n": 1}),
    "dispatch_many": lambda q: q.dispatch_many([{"data": 1}]),
    "get_job": lambda q: q.get_job("j"),
    "counts": lambda q: q.counts(),
}


def _expect_connection_failed(
    flavor: str,
    cluster: LocalCluster,
    prefix: str,
    name: str,
    breaks: Callable[[], None],
    refusals: tuple[type[Exception], ...] = (),
) -> list[Exception]:
    """Connect, `breaks()` the cluster, then a call of each kind of queue `name`: each
    raises ConnectionFailed naming it (or one of `refusals`); the errors."""
    failures: list[Exception] = []
    expected = (ConnectionFailed, *refusals)

    def scenario_sync(client: Any) -> None:
        breaks()
        for label, call in CALLS.items():
            with pytest.raises(expected) as err:
                call(client.queue(name))
            failures.append(err.value)
            if isinstance(err.value, ConnectionFailed):
                assert f"{label}() of queue {name!r}" in str(err.value)

    async def scenario_async(client: Any) -> None:
        breaks()
        for label, call in CALLS.items():
            with pytest.raises(expected) as err:
                await call(client.queue(name))
            failures.append(err.value)
            if isinstance(err.value, ConnectionFailed):
                assert f"{label}() of queue {name!r}" in str(err.value)

    run_flavor(flavor, cluster.url, prefix, scenario_sync if flavor == "sync" else scenario_async)
    for failure in failures:
        assert cluster.password not in str(failure)
        if isinstance(failure, ConnectionFailed):
            assert "***@127.0.0.1" in str(failure)
    return failures


@pytest.mark.parametrize("flavor", SYNC_ASYNC)
def test_every_primary_lost_after_connect_is_connection_failed(cluster: LocalCluster, flavor: str):
    """No node answers: redis-py raised RedisClusterException ("Redis Cluster cannot be
    connected. Please provide at least one reachable node"), not a ConnectionError."""
    prefix = prefix_on(cluster, cluster.ports[0], on=True)
    with Client(cluster.url, workers=0, prefix=prefix) as probe:
        name = queue_on(cluster, probe, cluster.ports[1])

    def kill_all() -> None:
        for port in list(cluster.ports):
            stop_node(cluster, port, "kill")

    for failure in _expect_connection_failed(flavor, cluster, prefix, name, kill_all):
        assert "cannot reach Redis at redis+cluster://" in str(failure)
        assert isinstance(failure.__cause__, redis.RedisError | RedisClusterException)


@pytest.mark.parametrize("flavor", SYNC_ASYNC)
def test_a_slot_no_node_serves_is_connection_failed(cluster: LocalCluster, flavor: str):
    """A slot that no node serves any more (CLUSTER DELSLOTS everywhere, the nodes not
    requiring full coverage): redis-py reads the slot map again and raised
    RedisClusterException ("All slots are not covered after query all startup_nodes")."""
    port = cluster.ports[1]
    prefix = prefix_on(cluster, port, on=False)
    with Client(cluster.url, workers=0, prefix=prefix) as probe:
        name = queue_on(cluster, probe, port)
        slot = cluster.slot(probe.queue(name).keys.base)

    def served(node: int) -> bool:
        return any(
            start <= slot <= end
            for start, end, *_ in cluster.node(node).execute_command("CLUSTER", "SLOTS")
        )

    def uncover() -> None:
        for node in cluster.ports:
            cluster.node(node).config_set("cluster-require-full-coverage", "no")
        for node in [port] + [p for p in cluster.ports if p != port]:
            cluster.node(node).execute_command("CLUSTER", "DELSLOTS", slot)
        wait_for(lambda: not any(served(n) for n in cluster.ports), 10.0, "the slot unserved")

    # the node that served the slot refuses a call sent on the client's old slot map
    # (CLUSTERDOWN: waited out, then ConnectionFailed: test_cluster_slot_down.py); the call
    # that reads the map again finds no node for the slot: RedisClusterException, now
    # ConnectionFailed
    failures = _expect_connection_failed(
        flavor, cluster, prefix, name, uncover, refusals=(ClusterDownError,)
    )
    failed = [f for f in failures if isinstance(f, ConnectionFailed)]
    assert failed and all("not covered" in str(f) for f in failed), failures


def test_partial_reads_go_on_past_a_cluster_no_node_answers(cluster: LocalCluster):
    """Reach (queasy status, the dashboard's overview): a read that met redis-py's
    RedisClusterException (no node answers) escaped; it is an Unreachable node now."""
    prefix = prefix_on(cluster, cluster.ports[0], on=True)
    with Client(cluster.url, workers=0, prefix=prefix) as client:
        for port in list(cluster.ports):
            stop_node(cluster, port, "kill")
        reach = Reach(client)
        assert reach.queue_names() == []
        assert not reach.complete
        (down,) = reach.down.values()
        assert isinstance(down, Unreachable) and "cannot be connected" in down.error


# ------------------------------------------------------------------ requeue_failed's TIME


def _time_calls(cluster: LocalCluster, port: int) -> int:
    stats = cluster.node(port).info("commandstats")
    return int(stats.get("cmdstat_time", {}).get("calls", 0))


@pytest.mark.parametrize("flavor", SYNC_ASYNC)
def test_requeue_failed_asks_the_time_of_the_queues_primary(cluster: LocalCluster, flavor: str):
    """requeue_failed() of a queue with a schedule takes a cutoff from the server's clock:
    redis-py sent TIME (no key) to its default node, another primary than the queue's
    (whose clock scored the failed records), and with that node down the async call
    failed. TIME goes to the queue's primary: counted there, and the default node killed."""
    with Client(cluster.url, workers=0, prefix="qr-probe") as probe:
        default = int(probe.redis.get_default_node().port)
    port = next(p for p in cluster.ports if p != default)
    prefix = prefix_on(cluster, default, on=False)
    with Client(cluster.url, workers=0, prefix=prefix) as probe:
        name = queue_on(cluster, probe, port)
    lua = lua_on(cluster, port, prefix, name)
    for job_id in ("x", "y"):
        lua.fail("c1", lua.take(job_id), fail_id=f"f-{job_id}")
    schedule(lua, None, NOW + 1, spec="every 1s")  # requeue_failed() asks TIME with one

    def requeue_twice(client: Any) -> Any:
        q = client.queue(name)
        assert q.client.redis.get_default_node().port == default  # type: ignore[union-attr]
        for node in cluster.ports:
            cluster.node(node).config_resetstat()
        first = q.requeue_failed()
        counted = {node: _time_calls(cluster, node) for node in cluster.ports}
        lua.fail("c1", lua.take("z"), fail_id="f-z")
        stop_node(cluster, default, "kill")
        return first, counted, q.requeue_failed()

    def requeue_async(client: Any) -> Any:
        async def go() -> Any:
            q = client.queue(name)
            assert client.redis.get_default_node().port == default
            for node in cluster.ports:
                cluster.node(node).config_resetstat()
            first = await q.requeue_failed()
            counted = {node: _time_calls(cluster, node) for node in cluster.ports}
            lua.fail("c1", lua.take("z"), fail_id="f-z")
            stop_node(cluster, default, "kill")
            return first, counted, await q.requeue_failed()

        return go()

    first, counted, second = run_flavor(
        flavor, cluster.url, prefix, requeue_twice if flavor == "sync" else requeue_async
    )
    assert first == 2 and second == 1
    # (the library's own calls ask TIME of their node too: counted on the queue's)
    assert counted[default] == 0 and counted[port] >= 1, counted


def test_async_result_asks_the_time_of_the_registrys_primary(cluster: LocalCluster):
    """AsyncQueue.result() reads the live supervisors with the server's clock: redis-py
    sent TIME to its default node, and with that node down result() failed for a job whose
    queue and registry live on primaries that answer (Client.result asks the registry's)."""
    with Client(cluster.url, workers=0, prefix="qr-probe") as probe:
        default = int(probe.redis.get_default_node().port)
    port = next(p for p in cluster.ports if p != default)
    prefix = next(
        p
        for p in (f"qr-{i}" for i in range(500))
        if cluster.owner(RegistryKeys(p).supervisors) == port
    )
    with Client(cluster.url, workers=0, prefix=prefix) as probe:
        name = queue_on(cluster, probe, port)
    lua = lua_on(cluster, port, prefix, name)
    lua.finish("c1", lua.take("done"))

    async def scenario() -> Any:
        async with AsyncClient(cluster.url, prefix=prefix) as client:
            assert client.redis.get_default_node().port == default
            stop_node(cluster, default, "kill")
            return await client.queue(name).result("done", timeout=5.0)

    assert asyncio.run(scenario()) is None  # finished (this queue stores no result)
