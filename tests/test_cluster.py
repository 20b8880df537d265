"""The producer API on a real local Redis Cluster (3 primaries, tests/cluster_servers.py):
`redis+cluster://` URLs, FCALL routed by the queue's key without COMMAND GETKEYS, the library
on every primary, `queasy run` on a cluster URL, clear errors for bad cluster URLs (AsyncClient:
tests/test_cluster_aio.py). The runtime on a cluster: tests marked ON_CLUSTER (runtime_helpers)
and tests/test_cluster_ops.py (resharding, failover)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from runtime_helpers import wait_for

from queasy_py import Client, ConfigError, ConnectionFailed
from queasy_py.store.clusterurl import parse_cluster_url
from queasy_py.store.embedded import EmbeddedServer
from queasy_py.store.library import bundled_version

#: the README's cluster additions to the ACL line of its Security section
CLUSTER_ACL = "+cluster|slots +command +asking"


@pytest.fixture
def cluster_client(local_cluster: Any) -> Any:
    client = Client(local_cluster.url, workers=0, prefix=f"qc-{uuid.uuid4().hex[:8]}")
    yield client
    client.close()


def spread_queues(cluster: Any, client: Client, count: int = 3) -> list[str]:
    """Queue names whose keys live on `count` different primaries."""
    by_owner: dict[int, str] = {}
    for i in range(200):
        name = f"q{i}"
        by_owner.setdefault(cluster.owner(client.queue(name).keys.base), name)
        if len(by_owner) == count:
            return sorted(by_owner.values())
    raise AssertionError("no queue names over every primary")


def getkeys_calls(cluster: Any) -> int:
    total = 0
    for port in cluster.ports:
        stats = cluster.node(port).info("commandstats")
        total += int(stats.get("cmdstat_command|getkeys", {}).get("calls", 0))
    return total


def test_the_producer_api_works_on_every_primary(local_cluster: Any, cluster_client: Client):
    names = spread_queues(local_cluster, cluster_client)
    for name in names:
        q = cluster_client.queue(name)
        q.dispatch({"n": 1}, id="one")
        q.dispatch_many([{"data": {"i": i}} for i in range(20)])
        q.dispatch({"later": True}, id="later", delay=3600)
        info = q.get_job("one")
        assert info is not None and info.state == "waiting" and info.data == {"n": 1}
        assert q.get_job("later").state == "delayed"  # type: ignore[union-attr]
        assert q.counts()["waiting"] == 21 and q.counts()["delayed"] == 1
        assert q.cancel("one") is True
        assert q.get_job("one").state == "cancelled"  # type: ignore[union-attr]
        listed, _ = q.jobs("waiting", limit=100)
        assert len(listed) == 20
        assert [e["outcome"] for e in q.events()] == ["cancelled"]
        assert q.purge("delayed") == 1
    assert cluster_client.queues() == names
    # each queue's record is on its own primary, not on the node the client met first
    owners = {local_cluster.owner(cluster_client.queue(n).keys.base) for n in names}
    assert len(owners) == 3


def test_the_encoded_stream_works_on_every_primary(local_cluster: Any, cluster_client: Client):
    """The Spark sink's path on a cluster: no connection pool to hold one batch in flight on,
    so one batch at a time through the cluster's pipeline, on each queue's own primary."""
    from queasy_py.encoded import dispatch_encoded_stream

    for name in spread_queues(local_cluster, cluster_client):
        q = cluster_client.queue(name)
        batches = [
            [x for i in range(600) for x in (f"{k}-{i}", b'{"k":%d}' % k, "")] for k in range(2)
        ]
        results = list(dispatch_encoded_stream(q, batches, dedup_window=60.0))
        assert [(r.created, r.skipped) for r in results] == [(600, 0), (600, 0)]
        (again,) = dispatch_encoded_stream(q, batches[:1], dedup_window=60.0)
        assert (again.created, again.updated) == (0, 600)  # waiting: updated, not doubled
        assert q.counts()["waiting"] == 1200
        assert q.get_job("1-599").data == {"k": 1}  # type: ignore[union-attr]


def test_fcall_is_routed_without_command_getkeys(local_cluster: Any, cluster_client: Client):
    names = spread_queues(local_cluster, cluster_client)
    cluster_client.ready()
    before = getkeys_calls(local_cluster)
    for name in names:
        q = cluster_client.queue(name)
        for i in range(30):
            q.dispatch({"i": i})
        q.dispatch_many([{"data": {"i": i}} for i in range(300)])  # pipelined
        q.counts()
    assert getkeys_calls(local_cluster) == before
    assert sum(cluster_client.queue(n).counts()["waiting"] for n in names) == 3 * 330


def test_the_library_is_loaded_on_every_primary(local_cluster: Any, cluster_client: Client):
    cluster_client.ready()
    for port in local_cluster.ports:
        reply = local_cluster.node(port).fcall_ro("queasy_library", 0)
        assert reply.decode().endswith(bundled_version())


def test_a_cluster_url_to_a_single_server_is_a_config_error():
    with EmbeddedServer() as single:
        client = Client(f"redis+cluster://:{single.password}@127.0.0.1:{single.port}", workers=0)
        with pytest.raises(ConfigError, match="not in cluster mode"):
            client.ready()
        client.close()


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://",
        "redis+cluster://127.0.0.1",
        "redis+cluster://h:1,h2",
        "redis+cluster://h:x",
    ],
)
def test_malformed_cluster_urls_are_refused_at_once(url: str):
    with pytest.raises(ConfigError, match="host:port"):
        Client(url, workers=0)


def test_unreachable_cluster_is_connection_failed_and_masks_the_password(caplog: Any):
    client = Client("redis+cluster://:pw-secret@127.0.0.1:1", workers=0)
    with caplog.at_level(logging.WARNING), pytest.raises(ConnectionFailed) as err:
        client.ready(attempts=2)
    assert "pw-secret" not in str(err.value) and "***" in str(err.value)
    assert "pw-secret" not in caplog.text
    client.close()


@pytest.mark.parametrize("credentials", [":wrong-pw-77@", "qnobody:wrong-pw-77@", ""])
def test_refused_credentials_on_a_cluster_are_authentication_failed_at_once(
    local_cluster: Any, tmp_path: Path, caplog: Any, credentials: str
):
    """A wrong password, an unknown user or none at all: AuthenticationFailed at once (as on
    one server), not ConnectionFailed after retries; `queasy run` exits CONNECT without
    waiting RUN_CONNECT_TIMEOUT (redis-py wraps the AuthenticationError in a
    RedisClusterException)."""
    from test_cli import run_queasy

    from queasy_py import AuthenticationFailed
    from queasy_py.cli import exitcodes

    nodes = ",".join(f"127.0.0.1:{p}" for p in local_cluster.ports)
    url = f"redis+cluster://{credentials}{nodes}"
    client = Client(url, workers=0)
    with caplog.at_level(logging.WARNING), pytest.raises(AuthenticationFailed) as err:
        client.ready()
    client.close()
    assert "refused the credentials" in str(err.value) and "wrong-pw-77" not in str(err.value)
    assert "retrying" not in caplog.text
    config = tmp_path / "queasy.toml"
    config.write_text('[queues.q]\nhandler = "tests.runtime_handlers.quiet"\n')
    started = time.monotonic()
    code, out = run_queasy(tmp_path, "run", "--redis", url, str(config), timeout=60)
    assert code == exitcodes.CONNECT, out
    assert "refused the credentials" in out and "retrying" not in out, out
    assert "wrong-pw-77" not in out and time.monotonic() - started < 30


def test_parse_cluster_url_reads_credentials_tls_and_nodes():
    nodes, options = parse_cluster_url("rediss+cluster://app:p%2Fw@10.0.0.1:7000,[::1]:7001")
    assert [(n.host, n.port) for n in nodes] == [("10.0.0.1", 7000), ("::1", 7001)]
    assert options["username"] == "app" and options["password"] == "p/w"
    assert options["ssl"] is True and options["ssl_check_hostname"] is True


def test_cluster_url_options_are_read_as_redis_py_reads_them(local_cluster: Any):
    """`?socket_timeout=5` is a number and `?ssl_check_hostname=false` a bool (as redis-py's
    from_url reads them for one server): they reached redis-py as strings, the first
    failing every connect as "Redis Cluster cannot be connected ... 'str' object cannot be
    interpreted as an integer" (ConnectionFailed, retried), the second a truthy "false"
    that left the README's way to turn the host name check off without effect."""
    _, options = parse_cluster_url("rediss+cluster://h:1?ssl_check_hostname=false&socket_timeout=5")
    assert options["ssl_check_hostname"] is False and options["socket_timeout"] == 5.0
    with Client(local_cluster.url + "?socket_timeout=5", workers=0, prefix="qopt") as client:
        assert client.queue("q").counts()["waiting"] == 0


def test_a_cluster_url_may_set_the_options_queasy_sets_too(local_cluster: Any):
    """?socket_timeout=, ?socket_connect_timeout=, ?socket_keepalive= (options queasy passes
    itself) crashed every client of the URL with a TypeError ("got multiple values for
    keyword argument"): the producer, AsyncClient, the loop's client and its node pipes.
    The URL's value wins, as redis-py's from_url does for one server."""
    import asyncio

    from queasy_py.aio import AsyncClient
    from queasy_py.store.cluster import loop_cluster_client, node_client

    url = local_cluster.url + "?socket_timeout=7&socket_connect_timeout=3&socket_keepalive=true"
    with Client(url, workers=0, prefix="qopt2") as client:
        assert client.queue("q").counts()["waiting"] == 0

    async def counts() -> dict[str, int]:
        async with AsyncClient(url, prefix="qopt2") as aclient:
            return await aclient.queue("q").counts()

    assert asyncio.run(counts())["waiting"] == 0
    loop = loop_cluster_client(url)
    try:
        assert loop.ping() is True
        node = loop.get_primaries()[0]
        assert node.redis_connection.connection_pool.connection_kwargs["socket_timeout"] == 7.0
    finally:
        loop.close()
    one = node_client(url, "127.0.0.1", local_cluster.ports[0])
    try:
        assert one.ping() is True
        assert one.connection_pool.connection_kwargs["socket_timeout"] == 7.0
    finally:
        one.close()


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("?sokcet_timeout=5", "sokcet_timeout"),  # a typo: redis-py's RedisCluster drops it
        ("?socket_timeout=soon", "socket_timeout"),
        ("?ssl_cert_reqs=required", "ssl_cert_reqs"),  # a TLS option on redis+cluster://
    ],
)
def test_a_cluster_url_option_redis_py_does_not_take_is_a_config_error(query: str, named: str):
    """As on one server (README, Security): an option redis-py does not take is a ConfigError
    naming it, raised when the client is made, not ignored and not an outage."""
    with pytest.raises(ConfigError, match=named) as err:
        Client(f"redis+cluster://:pw-secret-9@127.0.0.1:1{query}", workers=0)
    assert "pw-secret-9" not in str(err.value)


def test_queasy_dispatch_and_run_with_a_cluster_url(local_cluster: Any, tmp_path: Any):
    from test_cli import QUEASY, run_queasy

    prefix = f"qc-{uuid.uuid4().hex[:8]}"
    code, out = run_queasy(
        tmp_path, "dispatch", "mails", '{"to": "a@b"}', "--id", "m1",
        "--redis", local_cluster.url, "--prefix", prefix,
    )  # fmt: skip
    assert code == 0, out
    with Client(local_cluster.url, workers=0, prefix=prefix) as client:
        assert client.queue("mails").get_job("m1").data == {"to": "a@b"}  # type: ignore[union-attr]
    config = tmp_path / "queasy.toml"
    config.write_text(f'redis = "{local_cluster.url}"\nprefix = "{prefix}"\n'
                      '[queues.mails]\nhandler = "tests.runtime_handlers.quiet"\n')  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "QUEASY_REDIS_URL"}
    with (tmp_path / "run.log").open("wb") as log:
        run = subprocess.Popen(
            [QUEASY, "run", str(config)], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
            env={**env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        )  # fmt: skip
        try:
            with Client(local_cluster.url, workers=0, prefix=prefix) as client:
                wait_for(
                    lambda: client.queue("mails").get_job("m1").state == "finished",  # type: ignore[union-attr]
                    30, "m1 to run under `queasy run` on the cluster",
                )  # fmt: skip
        finally:
            run.send_signal(signal.SIGTERM)
            code = run.wait(timeout=30)
    out = (tmp_path / "run.log").read_text()
    assert code == 0, out
    assert local_cluster.password not in out and "%2F" not in out


# ---------------------------------------------------------------- the loop's connections


def test_a_round_is_split_by_primary_and_its_replies_come_back_in_order(
    local_cluster: Any, cluster_client: Client
):
    from queasy_py.store.clusterpipe import ClusterPipe

    names = spread_queues(local_cluster, cluster_client)
    for n, name in enumerate(names):
        cluster_client.queue(name).dispatch_many([{"data": {}} for _ in range(n + 1)])
    bases = [cluster_client.queue(name).keys.base for name in names]
    commands = [("FCALL_RO", "queasy_counts", 1, base, "") for base in bases * 3]
    pipe = ClusterPipe(local_cluster.url)
    got: list[Any] = []
    try:
        pipe.send(commands, got.extend, lambda exc: got.append(exc))
        pipe.send(commands[:1], got.extend, lambda exc: got.append(exc))
        assert len(pipe.socket()) == 3  # one connection per primary
        pipe.read(block=True)
    finally:
        pipe.close()
    assert not pipe.inflight
    waiting = [int(reply[0]) for reply in got]  # queasy_counts: waiting first
    assert waiting == [1, 2, 3] * 3 + [1]


def test_a_primary_idle_for_some_rounds_keeps_its_round_connection(
    local_cluster: Any, cluster_client: Client
):
    """Reading the round pipe (when any primary's socket is readable) reads every primary's
    pipe: one with nothing in flight must not be disconnected (and reconnected, AUTH and
    all, on its next round: a third of a supervisor's CPU on 3 primaries)."""
    from queasy_py.store.clusterpipe import ClusterPipe

    names = spread_queues(local_cluster, cluster_client)
    cluster_client.ready()
    bases = [cluster_client.queue(name).keys.base for name in names]
    busy, idle = bases[0], bases[1]
    port = local_cluster.owner(idle)
    pipe = ClusterPipe(local_cluster.url)

    def accepted() -> int:
        return int(local_cluster.node(port).info("stats")["total_connections_received"])

    got: list[Any] = []
    try:
        pipe.send([("FCALL_RO", "queasy_counts", 1, b, "") for b in bases], got.extend, got.append)
        pipe.read(block=True)
        before = accepted()
        for _ in range(20):  # rounds for the busy primary only
            pipe.send([("FCALL_RO", "queasy_counts", 1, busy, "")], got.extend, got.append)
            pipe.read(block=True)
        pipe.send([("FCALL_RO", "queasy_counts", 1, idle, "")], got.extend, got.append)
        pipe.read(block=True)
        # our own INFO connection counts one; the idle primary's pipe made none
        assert accepted() - before == 1
        local_cluster.node(port).execute_command(
            "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"
        )
        wait_for(lambda: pipe.read() or idle_dropped(pipe, port), 5.0, "the closed pipe reset")
    finally:
        pipe.close()
    assert len(got) == 3 + 20 + 1 and not any(isinstance(x, Exception) for x in got)


def idle_dropped(pipe: Any, port: int) -> bool:
    """Whether the node pipe to `port` let go of its connection (the server closed it)."""
    return next(p for n, p in pipe.pipes.items() if n[1] == port)._conn is None


def test_a_primarys_part_with_no_reply_in_time_is_lost_and_the_round_goes_on(
    local_cluster: Any, cluster_client: Client
):
    """ClusterPipe.expire: a part whose reply does not come within LOOP_REDIS_TIMEOUT (a
    BLPOP blocking past it, here; a connection dropped silently, on the network) is lost as
    its broken connection's (NodeLost replies for all of that part); the parts that answered
    keep their replies."""
    from queasy_py import defaults
    from queasy_py.store.clusterpipe import ClusterPipe, NodeLost

    names = spread_queues(local_cluster, cluster_client)
    bases = [cluster_client.queue(name).keys.base for name in names]
    commands: list = [("FCALL_RO", "queasy_counts", 1, base, "") for base in bases]
    blocked = ("WAIT", 99, 30_000)  # no key: the first primary's part; 99 replicas never ack
    pipe = ClusterPipe(local_cluster.url)
    got: list[Any] = []
    try:
        pipe.send([*commands, blocked], got.extend, got.append)
        assert pipe.deadline() <= time.monotonic() + defaults.LOOP_REDIS_TIMEOUT
        wait_for(lambda: (pipe.read(), pipe.inflight[0].answered == 2)[1], what="2 parts")
        pipe.expire(time.monotonic())  # within the bound: still waiting
        assert pipe.inflight and not got
        pipe.expire(pipe.deadline())
        assert not pipe.inflight and pipe.deadline() == float("inf")
    finally:
        pipe.close()
    assert len(got) == 4, got
    lost = [i for i, reply in enumerate(got) if isinstance(reply, NodeLost)]
    assert len(lost) == 2 and 3 in lost, got  # the WAIT and the first primary's queue's
    assert all(isinstance(got[i], list) for i in range(3) if i not in lost), got


@pytest.fixture
def rt(request: Any, redis_url: str, prefix: str, r: Any, tmp_path: Path) -> Any:
    from runtime_helpers import runtime

    with runtime(request, redis_url, prefix, r, tmp_path) as rt:
        yield rt


@pytest.mark.parametrize("rt", ["cluster"], indirect=True)
def test_a_primary_that_lost_the_library_gets_it_again_and_its_queue_runs_on(
    local_cluster: Any, rt: Any
):
    from runtime_helpers import queue_spec

    names = spread_queues(local_cluster, rt.queue("x").client)  # type: ignore[attr-defined]
    sup = rt.start({name: queue_spec() for name in names}, workers=1, poll_interval=0.5)
    for name in names:
        rt.queue(name).dispatch({"tag": f"{name}-before"})
    rt.wait_records(3, "end")
    lost = local_cluster.node(local_cluster.owner(rt.queue(names[1]).keys.base))
    lost.function_flush()  # as a restarted primary, or one that joined later, has none

    def reloaded() -> bool:  # by the supervisor: its next round there finds it gone
        try:
            return lost.fcall_ro("queasy_library", 0).decode().endswith(bundled_version())
        except redis.ResponseError:
            return False

    wait_for(reloaded, 15.0, "the supervisor to load the library on that primary again")
    for name in names:
        rt.queue(name).dispatch({"tag": f"{name}-after"})
    rt.wait_records(6, "end", timeout=30.0)
    assert {rec["tag"] for rec in rt.records("end")} >= {f"{n}-after" for n in names}
    assert "loading" in sup.log() and "Traceback" not in sup.log_without_job_tracebacks()
    assert sup.stop() == 0


@pytest.mark.parametrize("rt", ["cluster"], indirect=True)
def test_the_readme_acl_line_with_the_cluster_commands_is_enough(local_cluster: Any, rt: Any):
    from runtime_helpers import Runtime, queue_spec
    from test_security import acl_line

    user, password = "qcl", "pw-cl-7d1e"
    words = acl_line(user, password, rt.prefix).split()[2:] + CLUSTER_ACL.split()
    for port in local_cluster.ports:  # ACL SETUSER is per node
        local_cluster.node(port).execute_command("ACL", "SETUSER", *words)
    nodes = ",".join(f"127.0.0.1:{p}" for p in local_cluster.ports)
    url = f"redis+cluster://{user}:{password}@{nodes}"
    names = spread_queues(local_cluster, rt.queue("x").client)
    limited = Runtime(url, rt.prefix, rt.r, rt.tmp_path, (rt.records_url, rt.rec))
    with limited:
        sup = limited.start({n: queue_spec(store_results=True) for n in names}, workers=1)
        for name in names:
            limited.queue(name).dispatch({"tag": name}, id=f"{name}-1")
        limited.wait_records(3, "end", timeout=30.0)
        assert limited.queue(names[0]).result(f"{names[0]}-1", timeout=10.0) is None
        assert sup.stop() == 0
        assert "NOPERM" not in sup.log() and "Traceback" not in sup.log()


def test_a_user_who_may_not_read_the_slot_map_is_told_which_acl_to_grant(local_cluster: Any):
    from test_security import acl_line

    from queasy_py import AuthenticationFailed

    user, password = "qnoslots", "pw-ns-51c2"
    for port in local_cluster.ports:  # the ACL line of a single server: no CLUSTER SLOTS
        words = acl_line(user, password, "qns").split()[2:] + ["+command", "+asking"]
        local_cluster.node(port).execute_command("ACL", "SETUSER", *words)
    nodes = ",".join(f"127.0.0.1:{p}" for p in local_cluster.ports)
    client = Client(f"redis+cluster://{user}:{password}@{nodes}", workers=0, prefix="qns")
    with pytest.raises(AuthenticationFailed, match=r"\+cluster\|slots") as err:
        client.ready()
    assert password not in str(err.value)
    client.close()


def test_dequeue_and_finish_on_a_moving_slot_are_refused_before_they_read_or_write(
    local_cluster: Any, cluster_client: Client
):
    """queasy_dequeue and queasy_finish read the migration guard's keys with B:parked and
    B:blocked in one EXISTS (their first read): on the node importing the queue's slot
    (ASKING, as a client sent there by ASK) they answer TRYAGAIN, nothing read or written
    there nor on the source, and the lease is acked once the slot is stable again."""
    q = cluster_client.queue("guarded")
    q.dispatch({"n": 1}, id="a")
    base = q.keys.base
    slot = local_cluster.slot(base)
    source = local_cluster.owner_of_slot(slot)
    target = next(p for p in local_cluster.primary_ports() if p != source)
    src = local_cluster.node(source)
    reply = src.fcall("queasy_dequeue", 1, base, "", "c1", "n1", 1, 60000, 1000)
    token = reply[3].decode()
    dequeue = ("queasy_dequeue", 1, base, "", "c2", "n2", 10, 60000, 1000)
    finish = ("queasy_finish", 1, base, "", "c1", 1000, 100, 3600000, "host", 0)
    ack = ("a", token, "", "", "")
    dst = redis.Redis(port=target, password=local_cluster.password, single_connection_client=True)
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", local_cluster.node_id(source))
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", local_cluster.node_id(target))
    try:
        for call in (finish + ack, dequeue):
            dst.execute_command("ASKING")
            with pytest.raises(redis.exceptions.TryAgainError, match="is moving; try again"):
                dst.execute_command("FCALL", *call)
        assert dst.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    finally:
        for node in (dst, src):
            node.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        dst.close()
    assert src.hget(base + ":lease:c1", "a") is not None
    assert src.xlen(base + ":events") == 0 and src.zscore(base + ":expiry", "c2") is None
    assert src.execute_command("FCALL", *finish, *ack) == [0]
    assert q.counts()["finished"] == 1
