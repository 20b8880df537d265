"""A server that loses a dequeue while its job runs: the job waits again, and this supervisor
is leased it a second time while its first run still goes (a primary killed before its
replica received the dequeue: asynchronous replication, README "Redis Cluster"). The
supervisor holds the second lease and does not start it (runtime/twins.py) until the first
run ends, then hands it back: the job runs again after it, never twice at once here.

The lost write is made on the real server by putting back the job's keys as they were
before the dequeue (DUMP/RESTORE, the lease entry and the active record removed): the state
a promoted replica has when the dequeue never reached it. tests/test_cluster_ops.py kills
a real primary for the same case on a cluster, where whether a dequeue is lost is chance.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from runtime_helpers import Runtime, queue_spec, wait_for


@pytest.fixture
def rt(redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(redis_url, prefix, r, tmp_path) as runtime:
        yield runtime


def held_not_run(rt: Runtime, sup: Any, held: str, what: str) -> None:
    """Wait for the supervisor to log the second lease it holds (or for a second start, the
    bug), then check the job did not start twice."""
    wait_for(lambda: held in sup.log() or len(rt.records("start", id="s")) > 1, 10.0, what)
    assert len(rt.records("start", id="s")) == 1, "the job ran twice at once"


def test_a_job_leased_again_while_it_runs_waits_for_its_first_run(
    rt: Runtime, redis_url: str
) -> None:
    sup = rt.start({"q": queue_spec()}, workers=2, poll_interval=0.2)
    q = rt.queue("q")
    q.dispatch({"n": 0}, id="warm")
    rt.wait_records(1, "end", id="warm")
    q.dispatch({"gate": "s"}, id="s", delay=1.0)  # dequeued later: a snapshot before it
    raw = redis.Redis.from_url(redis_url)
    try:
        # (5.0: its record is a field of B:rec, where it stays while it is leased)
        before = {key: raw.dump(key) for key in (q.keys.waiting, q.keys.base + ":rec")}
        assert all(before.values()), before
        rt.wait_records(1, "start", id="s")
        leases = list(raw.scan_iter(match=f"{q.keys.base}:lease:*"))
        assert leases
        with raw.pipeline(transaction=True) as pipe:  # the dequeue lost: waiting, no lease
            for key, dumped in before.items():
                pipe.restore(key, 0, dumped, replace=True)
            for key in leases:
                pipe.hdel(key, "s")
            pipe.execute()
    finally:
        raw.close()
    held = "leased again while it runs here"
    held_not_run(rt, sup, held, "the job leased again")
    assert held in sup.log()
    rt.open_gate("s")
    rt.open_gate("s")  # for its second run, after the first

    def done() -> bool:
        counts = q.counts()
        return (
            len(rt.records("end", id="s")) == 2 and counts["active"] == 0 and counts["waiting"] == 0
        )

    wait_for(done, 15.0, "the job's second run, once its first ended")
    runs = [rec["event"] for rec in rt.records(id="s")]
    assert runs == ["start", "end", "start", "end"], runs  # one after the other
    job = q.get_job("s")
    assert job is not None and job.state == "finished", job
    log = sup.log()
    assert "stale finish of job s" in log  # the first run's lease was gone
    assert "job s of q handed back to waiting, not counted" in log
    assert sup.proc.poll() is None
    assert sup.stop() == 0
    assert "Traceback" not in sup.log_without_job_tracebacks()


def test_a_job_pushed_again_while_it_runs_waits_for_its_first_run(
    rt: Runtime, redis_url: str
) -> None:
    """The server loses the job whole (its dispatch and its dequeue) and the producer
    dispatches it again, as the README advises after a lost primary: the dispatch leases it
    straight to this idle supervisor (a push), which holds it as above."""
    sup = rt.start({"q": queue_spec()}, workers=2, poll_interval=30.0)
    q = rt.queue("q")
    q.dispatch({"n": 0}, id="warm")
    rt.wait_records(1, "end", id="warm")
    q.dispatch({"gate": "s"}, id="s")
    rt.wait_records(1, "start", id="s")
    raw = redis.Redis.from_url(redis_url)
    try:
        leases = list(raw.scan_iter(match=f"{q.keys.base}:lease:*"))
        assert leases
        with raw.pipeline(transaction=True) as pipe:  # the server never had the job
            pipe.hdel(q.keys.base + ":rec", "s")  # (5.0: its record, a field of B:rec)
            pipe.zrem(q.keys.waiting, "s")
            for key in leases:
                pipe.hdel(key, "s")
            pipe.execute()
    finally:
        raw.close()
    q.dispatch({"gate": "s"}, id="s")
    held = "leased again while it runs here"
    held_not_run(rt, sup, held, "the job pushed again")
    rt.open_gate("s")
    rt.open_gate("s")
    wait_for(
        lambda: len(rt.records("end", id="s")) == 2 and q.counts()["active"] == 0,
        15.0,
        "the job's second run, once its first ended",
    )
    runs = [rec["event"] for rec in rt.records(id="s")]
    assert runs == ["start", "end", "start", "end"], runs
    assert sup.stop() == 0
    assert "Traceback" not in sup.log_without_job_tracebacks()
