"""Push hand-off with a real supervisor: an idle one parks its free slots, takes a pushed job,
returns one it has no room for (no event, nothing lost), and finds a push lost with its pub/sub
connection when it reconciles.

The Lua side alone is in test_push.py.
"""

from __future__ import annotations

import records
import redis
from runtime_helpers import ON_CLUSTER, Runtime, queue_spec, wait_for

from queasy_py.store.keys import QueueKeys


def parked(rt: Runtime, queue: str) -> dict[str, str]:
    return rt.r.hgetall(QueueKeys(rt.prefix, queue, queue).base + ":parked")


def wait_parked(rt: Runtime, queue: str, slots: str) -> str:
    """Wait until one client has `slots` parked on `queue`; return its id."""
    found = wait_for(
        lambda: (p := parked(rt, queue)) and list(p.values()) == [slots] and p,
        what=f"{slots} slot(s) parked on {queue}",
    )
    return next(iter(found))


def subscribers(rt: Runtime) -> list[dict]:
    """The server's connections subscribed to any channel (CLIENT LIST)."""
    return [c for c in rt.r.client_list() if int(c.get("sub", 0)) + int(c.get("ssub", 0)) > 0]


def outcomes(rt: Runtime, queue: str) -> list[str]:
    return [e["outcome"] for e in rt.events(queue)]


@ON_CLUSTER
def test_an_idle_supervisor_parks_its_slots_and_runs_a_pushed_job(rt: Runtime) -> None:
    # poll_interval 30 s: no polling dequeue; one worker of 100 units, size 10: 10 slots
    rt.start({"q": queue_spec()}, poll_interval=30.0)
    client = wait_parked(rt, "q", "10")

    job_id = rt.queue("q").dispatch({"tag": "p", "gate": "p"})
    rt.wait_records(1, "start", tag="p")
    keys = QueueKeys(rt.prefix, "q", "q")
    assert records.is_active(rt.r, keys.base, job_id)
    # leased by the dispatch, not a dequeue (library 4.0.0: the lease is in the client's hash)
    assert rt.r.hget(keys.lease(client), job_id).startswith("p")
    rt.open_gate("p")
    rt.wait_events("q", 1)
    assert outcomes(rt, "q") == ["finished"]
    wait_parked(rt, "q", "10")  # its slot parked again with the ack


def test_a_pushed_job_without_free_units_is_returned_and_runs_later(rt: Runtime) -> None:
    # one worker; each queue's jobs take the whole worker: each queue parks 1 slot
    rt.start({"a": queue_spec(size=100), "b": queue_spec(size=100)}, poll_interval=30.0)
    wait_parked(rt, "a", "1")
    wait_parked(rt, "b", "1")
    rt.queue("a").dispatch({"tag": "a", "gate": "a"})
    rt.wait_records(1, "start", tag="a")

    b_id = rt.queue("b").dispatch({"tag": "b"})  # pushed to the busy supervisor: returned
    job = wait_for(
        lambda: (j := rt.queue("b").get_job(b_id)) and j.state == "waiting" and j,
        what="the pushed job back in waiting",
    )
    assert (job.retry_count, job.stall_count, job.timeout_count) == (0, 0, 0)
    assert parked(rt, "b") == {}
    assert rt.records("start", tag="b") == []

    rt.open_gate("a")
    rt.wait_records(1, "end", tag="b")
    rt.wait_events("b", 1)
    assert outcomes(rt, "b") == ["finished"]  # the return left no event
    (a_end,) = rt.records("end", tag="a")
    (b_start,) = rt.records("start", tag="b")
    assert b_start["t"] >= a_end["t"]


def test_a_push_lost_with_the_pubsub_connection_is_handed_back_and_runs(
    rt: Runtime, redis_url: str
) -> None:
    rt.start({"q": queue_spec()}, poll_interval=30.0)
    client = wait_parked(rt, "q", "10")
    base = QueueKeys(rt.prefix, "q", "q").base

    # a stand-in listener on the supervisor's push channel, so the dispatch below does push
    stand_in = redis.Redis.from_url(redis_url, client_name="stand-in")
    listener = stand_in.pubsub(ignore_subscribe_messages=True)
    listener.ssubscribe(f"{base}:push:{client}")
    wait_for(lambda: len(subscribers(rt)) == 2, what="the stand-in subscribed")
    (theirs,) = [c for c in subscribers(rt) if c["name"] != "stand-in"]  # the supervisor's

    # in one transaction: its connection is killed, then the job is pushed to it
    with rt.r.pipeline(transaction=True) as tx:
        tx.execute_command("CLIENT", "KILL", "ID", theirs["id"])
        flags = ("1", "replace", "1", "")  # update data, run_at, reset counts; no trace
        tx.fcall("queasy_dispatch", 1, base, "", *flags, "lost", '{"tag": "lost"}', "")
        killed, codes = tx.execute()
    assert killed and codes == [1]
    message = wait_for(lambda: listener.get_message(timeout=0.1), what="the push")
    assert message["data"].startswith(b"lost\n")  # leased to the supervisor, which never saw it

    rt.wait_records(1, "end", tag="lost")  # its reconcile handed it back, then it ran
    rt.wait_events("q", 2)
    assert outcomes(rt, "q") == ["released", "finished"]
    assert len(rt.records("start", tag="lost")) == 1
    listener.close()
    stand_in.close()
