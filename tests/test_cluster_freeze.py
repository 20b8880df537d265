"""A silent primary under a busy supervisor on a Redis Cluster: a primary SIGSTOPped (its
connections stay open, nothing answers) and failed over by the cluster after its node
timeout, and a primary frozen for longer than LOOP_REDIS_TIMEOUT while its slot is being
resharded (thawed before the cluster fails it over).

The supervisor must not stall on the silent node: a round with no reply in
LOOP_REDIS_TIMEOUT is an outage, and the wake-up subscriptions follow the slots to the
promoted replica (the polling fallback is 30 s here: a job dispatched after the failover is
started by its wake-up or push, not by polling). Invariants as in tests/test_cluster_ops.py:
every job runs, once; a singleton id never runs twice at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from cluster_servers import LocalCluster
from runtime_helpers import Runtime, queue_spec, wait_for
from test_cluster_ops import cluster_runtime, overlaps

from queasy_py import Client
from queasy_py.store.cluster import slot_owner
from queasy_py.store.connection import loop_client, reroute

POLL = 30.0  # the supervisor's polling fallback: longer than any wait below
UNIQUE = 60
SINGLETONS = 4


@pytest.fixture(scope="module")
def ha_cluster() -> Iterator[LocalCluster]:
    # node timeout 5 s: well above LOOP_REDIS_TIMEOUT (2 s), so a freeze between the two
    # holds rounds with no reply that the cluster does not fail over
    cluster = LocalCluster(primaries=3, replicas=1, node_timeout=5000).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def rt(ha_cluster: LocalCluster, redis_url: str, r: redis.Redis, tmp_path: Path) -> Iterator[Any]:
    with cluster_runtime(ha_cluster, "frz", redis_url, r, tmp_path) as runtime:
        yield runtime


def dispatch_load(q: Any, sleep: float) -> list[str]:
    """UNIQUE unique jobs and the singleton ids dispatched again and again (in order)."""
    ids = []
    for i in range(UNIQUE):
        q.dispatch({"tag": "u", "sleep": sleep}, id=f"u{i}")
        ids.append(f"u{i}")
        q.dispatch({"tag": "s", "sleep": 0.1, "n": i}, id=f"s{i % SINGLETONS}")
    return ids


def check(rt: Runtime, ids: list[str], sup: Any) -> None:
    """Every id in `ids` ran once, no singleton twice at once; the supervisor is up."""
    records = rt.records()
    starts = [rec["id"] for rec in records if rec["event"] == "start"]
    assert sorted(i for i in starts if not i.startswith("s")) == sorted(ids)
    for n in range(SINGLETONS):
        assert not overlaps(records, f"s{n}"), f"s{n} ran twice at once"
    assert sup.proc.poll() is None, "the supervisor exited"
    assert sup.stop() == 0
    assert "Traceback" not in sup.log_without_job_tracebacks()


def test_a_busy_queues_primary_freezes_and_the_cluster_fails_it_over(
    ha_cluster: LocalCluster, rt: Runtime
) -> None:
    sup = rt.start({"busy": queue_spec()}, workers=2, poll_interval=POLL)
    q = rt.queue("busy")
    ids = dispatch_load(q, 0.2)
    rt.wait_records(10, "end", timeout=30.0)  # busy before the freeze
    frozen = ha_cluster.owner_of_slot(ha_cluster.slot(q.keys.base))
    loop_r = loop_client(ha_cluster.url)  # its slot map read before the freeze
    try:
        promoted = ha_cluster.freeze(frozen, failover=True)  # the cluster promotes its replica
        # the loop's reconcile reads the map again first (Rounds._reconcile): else its calls
        # go on to the silent node, 4 s lost on each (redis-py sends a pipeline's call again)
        assert slot_owner(loop_r, q.keys.base)[1] == frozen
        reroute(loop_r)
        assert slot_owner(loop_r, q.keys.base)[1] == promoted
        wait_for(
            lambda: {r["id"] for r in rt.records("end")} >= {*ids, "s0", "s1", "s2", "s3"},
            30.0,
            "the jobs dispatched before the freeze to end",
        )
        # a fresh producer (its slot map read now) on the promoted replica; the supervisor
        # is idle: only a wake-up or a push (its subscription moved) starts these in time
        with Client(ha_cluster.url, workers=0, prefix=rt.prefix) as producer:
            after = producer.queue("busy")
            began = time.monotonic()
            for i in range(5):
                after.dispatch({"tag": "after"}, id=f"after{i}")
                ids.append(f"after{i}")
            wait_for(
                lambda: len(rt.records("end", tag="after")) == 5,
                POLL / 2,
                "the jobs dispatched after the failover to run (woken, not polled)",
            )
            assert time.monotonic() - began < POLL / 2
        check(rt, ids, sup)
    finally:
        loop_r.close()
        ha_cluster.thaw(frozen)  # it rejoins as a replica


def test_a_primary_freezes_while_its_busy_queues_slot_moves(
    ha_cluster: LocalCluster, rt: Runtime
) -> None:
    """The primary of a busy queue is frozen for 4 s (longer than LOOP_REDIS_TIMEOUT,
    shorter than the node timeout) as its slot starts moving to another primary: the
    supervisor's rounds to it get no reply and time out (an outage, not a stall); the
    reshard, started during the freeze, waits for the thaw, then the slot moves (MIGRATING,
    the keys in small batches) while the supervisor comes back from the outage. (A freeze
    begun once the slot is migrating may meet no round: the loop backs off on the moving
    slot's TRYAGAIN, up to 5 s between rounds.)"""
    sup = rt.start({"busy": queue_spec()}, workers=2, poll_interval=POLL)
    q = rt.queue("busy")
    ids = dispatch_load(q, 0.5)  # 1.5 s of work, acks and dequeues all along
    rt.wait_records(10, "end", timeout=30.0)
    slot = ha_cluster.slot(q.keys.base)
    source = ha_cluster.owner_of_slot(slot)
    target = next(p for p in ha_cluster.primary_ports() if p != source)
    moved: list[int] = []
    ha_cluster.freeze(source)  # the busy supervisor's next round meets the silence
    mover = threading.Thread(
        target=lambda: moved.append(ha_cluster.move_slot(slot, target, 3, 0.05, 0.5))
    )
    mover.start()  # the reshard's steps on the source (its first) wait for the thaw
    try:
        time.sleep(4.0)  # the freeze itself (no wait on an outcome)
    finally:
        ha_cluster.thaw(source)
        mover.join(timeout=60)
    assert moved and ha_cluster.owner_of_slot(slot) == target
    wait_for(
        lambda: {r["id"] for r in rt.records("end")} >= {*ids, "s0", "s1", "s2", "s3"},
        30.0,
        "every job to end",
    )
    check(rt, ids, sup)
    # a round sent to the silent node was an outage after LOOP_REDIS_TIMEOUT, not a stall
    assert "Redis unreachable or refusing (TimeoutError): no reply within" in sup.log()
