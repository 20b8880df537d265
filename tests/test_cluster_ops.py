"""The supervisor on a Redis Cluster while the cluster changes under it: a busy queue's slot
resharded to another primary while its jobs run, a primary failed over to its replica, and a
primary killed (SIGKILL) and replaced by its replica (weaker invariants: see that test).

A local cluster of 3 primaries, each with a replica (tests/cluster_servers.py). A producer
dispatches unique jobs and re-dispatches a few singleton ids all along; the handler records
each start and end on the embedded server (never on the cluster that moves). Invariants:
every unique job ran exactly once (none lost, none twice), a singleton id never ran twice at
once, and each singleton id's last dispatch ran after it was made; the supervisor never
exits and logs no traceback. Clients see only delays (the producer's calls wait out the
moving slot).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from cluster_servers import LocalCluster
from runtime_helpers import Runtime, queue_spec, wait_for

from queasy_py import ConnectionFailed

UNIQUE = 150  # unique jobs, dispatched over the disturbance
SINGLETONS = 4  # ids dispatched again and again


@pytest.fixture(scope="module")
def ha_cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster(primaries=3, replicas=1).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def cluster_runtime(
    cluster: LocalCluster, tag: str, redis_url: str, r: redis.Redis, tmp_path: Path
) -> Iterator[Any]:
    """A Runtime on `cluster` (its view a RedisCluster client), records on the test server."""
    from redis.cluster import RedisCluster

    from queasy_py.store.clusterurl import parse_cluster_url

    nodes, options = parse_cluster_url(cluster.url)
    view = RedisCluster(startup_nodes=nodes, decode_responses=True, **options)
    prefix = f"{tag}-{uuid.uuid4().hex[:8]}"
    try:
        with Runtime(cluster.url, prefix, view, tmp_path, (redis_url, r)) as runtime:  # type: ignore[arg-type]
            yield runtime
    finally:
        view.close()


@pytest.fixture
def rt(ha_cluster: LocalCluster, redis_url: str, r: redis.Redis, tmp_path: Path) -> Iterator[Any]:
    with cluster_runtime(ha_cluster, "ops", redis_url, r, tmp_path) as runtime:
        yield runtime


def overlaps(records: list[dict[str, Any]], job_id: str) -> bool:
    """Whether two runs of `job_id` overlapped in time (start/end records, in order)."""
    running = 0
    for rec in records:
        if rec["id"] != job_id:
            continue
        running += 1 if rec["event"] == "start" else -1
        if running > 1:
            return True
    return False


def busy_queue_while(rt: Runtime, disturb: Callable[[str], None]) -> None:
    """Run the busy queue's load, call `disturb(base)` in the middle, check the invariants."""
    sup = rt.start({"busy": queue_spec()}, workers=2, poll_interval=0.5)
    q = rt.queue("busy")
    last_dispatch: dict[str, float] = {}
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            for i in range(UNIQUE):
                if i % 10:
                    q.dispatch({"tag": "u", "sleep": 0.01}, id=f"u{i}")
                else:  # a pipelined batch now and then
                    q.dispatch_many([{"data": {"tag": "u"}, "id": f"u{i}"}])
                sid = f"s{i % SINGLETONS}"
                last_dispatch[sid] = time.time()
                q.dispatch({"tag": "s", "sleep": 0.03, "n": i}, id=sid)
                time.sleep(0.01)
        except BaseException as exc:  # the test fails below with it
            errors.append(exc)

    producer = threading.Thread(target=produce)
    producer.start()
    rt.wait_records(20, "end", timeout=30.0)  # busy before the disturbance
    disturb(q.keys.base)
    producer.join(timeout=120)
    assert not producer.is_alive() and not errors, errors

    def settled() -> bool:
        ends = rt.records("end")
        done = {rec["id"] for rec in ends if rec["id"].startswith("u")}
        late = all(
            any(rec["id"] == sid and rec["t"] >= at for rec in rt.records("start"))
            for sid, at in last_dispatch.items()
        )
        return len(done) == UNIQUE and late

    wait_for(settled, 60.0, "every unique job and each singleton's last dispatch to run")
    records = rt.records()
    starts = [rec["id"] for rec in records if rec["event"] == "start"]
    assert sorted(i for i in starts if i.startswith("u")) == sorted(f"u{i}" for i in range(UNIQUE))
    for sid in last_dispatch:
        assert not overlaps(records, sid), f"{sid} ran twice at once"
    assert sup.proc.poll() is None, "the supervisor exited"
    assert sup.stop() == 0
    assert "Traceback" not in sup.log_without_job_tracebacks()
    # MOVED, ASK, TRYAGAIN are followed, not an outage: at most a throttled WARNING
    assert " ERROR " not in sup.log(), sup.log()
    assert sup.log().count("slot moving") <= 1, sup.log()


def test_a_busy_queues_slot_moves_to_another_primary_while_its_jobs_run(
    ha_cluster: LocalCluster, rt: Runtime
) -> None:
    moved: list[int] = []

    def reshard(base: str) -> None:
        slot = ha_cluster.slot(base)
        source = ha_cluster.owner_of_slot(slot)
        target = next(p for p in ha_cluster.primary_ports() if p != source)
        moved.append(ha_cluster.move_slot(slot, target, batch=3, pause=0.05))
        assert ha_cluster.owner_of_slot(slot) == target

    busy_queue_while(rt, reshard)
    assert moved and moved[0] > 0  # the queue's keys moved with the slot


def test_a_busy_queues_primary_fails_over_to_its_replica(
    ha_cluster: LocalCluster, rt: Runtime
) -> None:
    def failover(base: str) -> None:
        primary = ha_cluster.owner_of_slot(ha_cluster.slot(base))
        replica = ha_cluster.failover(primary)
        assert ha_cluster.owner_of_slot(ha_cluster.slot(base)) == replica

    busy_queue_while(rt, failover)


def test_a_producer_waits_out_a_slot_that_stays_migrating(ha_cluster: LocalCluster) -> None:
    """A slot migrating for 1.5 s (longer than redis-py's own redirections last): a pipelined
    dispatch_many waits, then lands once, on the new owner (and a dispatch after it)."""
    from queasy_py import Client

    with Client(ha_cluster.url, workers=0, prefix=f"ops-{uuid.uuid4().hex[:8]}") as client:
        q = client.queue("moving")
        q.dispatch({"n": 0}, id="before")
        slot = ha_cluster.slot(q.keys.base)
        source = ha_cluster.owner_of_slot(slot)
        target = next(p for p in ha_cluster.primary_ports() if p != source)
        mover = threading.Thread(target=ha_cluster.move_slot, args=(slot, target, 5, 0.0, 1.5))
        mover.start()
        try:
            wait_for(lambda: ha_cluster.node(source).execute_command("CLUSTER", "NODES")
                     .decode().count(f"[{slot}->-"), 5.0, "the slot to be migrating")  # fmt: skip
            began = time.monotonic()
            q.dispatch_many([{"data": {"n": i}, "id": f"many{i}"} for i in range(5)])
            waited = time.monotonic() - began
            q.dispatch({"n": 1}, id="during")
        finally:
            mover.join(timeout=30)
        assert ha_cluster.owner_of_slot(slot) == target
        assert waited >= 0.5, waited  # it met the moving slot, and waited it out
        assert q.counts()["waiting"] == 7
        assert {j.id for j in q.jobs("waiting", limit=10)[0]} == {
            "before",
            "during",
            *(f"many{i}" for i in range(5)),
        }


def test_an_async_producer_waits_out_a_slot_that_stays_migrating(ha_cluster: LocalCluster) -> None:
    """AsyncClient as Client above: a dispatch and a pipelined dispatch_many during a slot
    held migrating for 1.5 s wait, then land once, on the new owner."""
    import asyncio

    from queasy_py.aio import AsyncClient

    prefix = f"ops-{uuid.uuid4().hex[:8]}"

    async def scenario() -> tuple[float, dict[str, int], set[str]]:
        async with AsyncClient(ha_cluster.url, prefix=prefix) as client:
            q = client.queue("moving-aio")
            await q.dispatch({"n": 0}, id="before")
            slot = ha_cluster.slot(q.keys.base)
            source = ha_cluster.owner_of_slot(slot)
            target = next(p for p in ha_cluster.primary_ports() if p != source)
            mover = threading.Thread(target=ha_cluster.move_slot, args=(slot, target, 5, 0.0, 1.5))
            mover.start()
            try:
                await asyncio.to_thread(
                    wait_for,
                    lambda: ha_cluster.node(source).execute_command("CLUSTER", "NODES")
                    .decode().count(f"[{slot}->-"),
                    5.0,
                    "the slot to be migrating",
                )  # fmt: skip
                began = time.monotonic()
                await q.dispatch({"n": 1}, id="during")
                await q.dispatch_many([{"data": {"n": i}, "id": f"many{i}"} for i in range(5)])
                waited = time.monotonic() - began
            finally:
                await asyncio.to_thread(mover.join, 30)
            assert ha_cluster.owner_of_slot(slot) == target
            ids = {j.id for j in (await q.jobs("waiting", limit=10))[0]}
            return waited, await q.counts(), ids

    waited, counts, ids = asyncio.run(scenario())
    assert waited >= 0.5, waited  # it met the moving slot, and waited it out
    assert counts["waiting"] == 7
    assert ids == {"before", "during", *(f"many{i}" for i in range(5))}


def test_a_busy_queues_primary_is_killed_and_the_cluster_promotes_its_replica(
    ha_cluster: LocalCluster, rt: Runtime
) -> None:
    """SIGKILL, not CLUSTER FAILOVER: replication is asynchronous, so what the killed primary
    had acknowledged but not yet sent to its replica is lost (README, Redis Cluster). What is
    checked is what still holds: the supervisor stays up (no traceback) and goes on with the
    promoted replica; every job the promoted primary holds runs (nothing stays stuck under a
    lease the supervisor lost), so does every job dispatched after the promotion, and each
    singleton id's last dispatch; a job that never ran was acknowledged before the promotion
    (lost with the primary); never two runs of one id at once: a dequeue lost with the primary
    leaves the job waiting again on the replica, and the supervisor, leased it again while
    its first run goes on, holds that lease until the run ends (runtime/twins.py)."""
    from redis.exceptions import RedisClusterException

    sup = rt.start({"busy": queue_spec()}, workers=2, poll_interval=0.5)
    q = rt.queue("busy")
    acked: dict[str, float] = {}  # unique id -> when its dispatch returned
    last_dispatch: dict[str, float] = {}
    promoted = threading.Event()
    errors: list[BaseException] = []

    def dispatch(job_id: str, data: dict[str, Any]) -> float:
        """Dispatch until a call returns: a call that met the dead primary may or may not
        have run (never sent again by the client): sent again here, at least once. The dead
        primary is a ConnectionFailed (queasy_py/connfailed.py), and so is CLUSTERDOWN past the
        client's wait; a refusal for a moving slot stays redis-py's."""
        deadline = time.monotonic() + 60.0
        while True:
            try:
                q.dispatch(data, id=job_id)
                return time.time()
            except (ConnectionFailed, redis.RedisError, RedisClusterException):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def produce() -> None:
        try:
            for i in range(UNIQUE):
                acked[f"u{i}"] = dispatch(f"u{i}", {"tag": "u", "sleep": 0.01})
                sid = f"s{i % SINGLETONS}"
                last_dispatch[sid] = time.time()
                dispatch(sid, {"tag": "s", "sleep": 0.03, "n": i})
                time.sleep(0.01)
            assert promoted.wait(60.0)
            for i in range(UNIQUE, UNIQUE + 10):  # after the promotion: these must run
                acked[f"u{i}"] = dispatch(f"u{i}", {"tag": "u"})
            for n in range(SINGLETONS):
                last_dispatch[f"s{n}"] = time.time()
                dispatch(f"s{n}", {"tag": "s", "n": "last"})
        except BaseException as exc:  # the test fails below with it
            errors.append(exc)

    producer = threading.Thread(target=produce)
    producer.start()
    killed: int | None = None
    try:
        rt.wait_records(20, "end", timeout=30.0)  # busy before the kill
        killed = ha_cluster.owner_of_slot(ha_cluster.slot(q.keys.base))
        ha_cluster.kill(killed)
        promoted_at = time.time()
        promoted.set()
        producer.join(timeout=120)
        assert not producer.is_alive() and not errors, errors

        def settled() -> bool:
            starts = rt.records("start")
            ran = {rec["id"] for rec in starts}
            late = all(
                any(rec["id"] == sid and rec["t"] >= at for rec in starts)
                for sid, at in last_dispatch.items()
            )
            after = all(i in ran for i, at in acked.items() if at >= promoted_at)
            stuck = any(i not in ran and q.get_job(i) is not None for i in acked)
            return late and after and not stuck and q.counts()["active"] == 0

        wait_for(settled, 60.0, "every job held or dispatched after the promotion to run")
        records = rt.records()
        ran = {rec["id"] for rec in records if rec["event"] == "start"}
        lost = [i for i in acked if i not in ran]
        assert all(acked[i] < promoted_at and q.get_job(i) is None for i in lost), lost
        for job_id in ran:
            assert not overlaps(records, job_id), f"{job_id} ran twice at once"
        held = sup.log().count("leased again while it runs here")
        print(f"\nkill: {len(lost)} lost, {len(ran)} ran, {held} held", file=sys.stderr)
        assert sup.proc.poll() is None, "the supervisor exited"
        assert sup.stop() == 0
        assert "Traceback" not in sup.log_without_job_tracebacks()
        # a lost primary is an outage of its rounds (an ERROR), not a redirection
        assert "ERROR Redis unreachable or refusing (ConnectionError)" in sup.log()
    finally:
        producer.join(timeout=120)
        if killed is not None:
            ha_cluster.restart(killed)  # a replica again, for the module's other tests
