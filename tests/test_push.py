"""Push hand-off in the Lua library: an idle client parks its free slots, and dispatch leases a
ready job straight to a live, listening parked client and PUBLISHes it on its push channel.

A real subscriber listens on the push channel, so PUBLISH counts a receiver as it does for a
supervisor.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import records
import redis
from lua_calls import EXPIRY, NOW, Leased, Lua

from queasy_py.store.library import Ack, Dispatched, ensure_loaded

SOON = NOW + 1_000
DEAD = NOW + EXPIRY + 1


@pytest.fixture
def lua(r: redis.Redis, redis_url: str, prefix: str) -> Lua:
    with redis.Redis.from_url(redis_url) as conn:
        ensure_loaded(conn)
    return Lua(r, prefix)


class Listener:
    """A pub/sub connection subscribed to push and wake channels of the queue."""

    def __init__(self, redis_url: str, lua: Lua, *clients: str) -> None:
        self.conn = redis.Redis.from_url(redis_url, decode_responses=True)
        self.pubsub = self.conn.pubsub(ignore_subscribe_messages=True)
        channels = [f"{lua.B}:push:{c}" for c in clients]
        self.pubsub.ssubscribe(lua.B + ":wake", lua.B + ":end", *channels)
        self.B = lua.B

    def messages(self) -> list[tuple[str, str]]:
        """(channel suffix, data) of every message published so far."""
        self.conn.spublish(self.B + ":end", "")  # delivered after every earlier message
        out = []
        deadline = time.monotonic() + 5.0
        while True:
            assert time.monotonic() < deadline, "the end mark did not come back"
            message = self.pubsub.get_message(timeout=1.0)  # None: a subscribe reply
            if message is None:
                continue
            if message["channel"] == self.B + ":end":
                return out
            out.append((message["channel"][len(self.B) + 1 :], message["data"]))

    def close(self) -> None:
        self.pubsub.close()
        self.conn.close()


@pytest.fixture
def listen(redis_url: str, lua: Lua) -> Iterator:
    made: list[Listener] = []

    def start(*clients: str) -> Listener:
        made.append(Listener(redis_url, lua, *clients))
        return made[-1]

    yield start
    for listener in made:
        listener.close()


def pushed(data: str) -> Leased:
    """Parse a push message: id, token, run_at, counts, trace, then the data (which may
    hold \\n)."""
    id, token, run_at, r, s, t, trace, body = data.split("\n", 7)
    return Leased(id, token, body, int(run_at), int(r), int(s), int(t), trace)


def test_an_idle_client_parks_its_free_slots_and_a_ready_job_is_pushed_to_it(
    lua: Lua, listen
) -> None:
    ear = listen("c1")
    assert lua.dequeue("c1", limit=3, park=True).jobs == []
    assert lua.parked() == {"c1": 3}
    assert lua.add("a", data='{"line":"one\\ntwo"}') == Dispatched.CREATED
    [(channel, data)] = ear.messages()  # no wake-up: the job went to c1 directly
    assert channel == "push:c1"
    job = pushed(data)
    assert (job.id, job.data, job.run_at, job.retry_count) == ("a", '{"line":"one\\ntwo"}', NOW, 0)
    assert lua.get_job("a")["state"] == "active"
    assert lua.counts() == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 1}
    assert lua.parked() == {"c1": 2}
    assert lua.finish("c1", job) == Ack.OK
    assert [e["outcome"] for e in lua.events()] == ["finished"]
    assert lua.get_job("a")["state"] == "finished"


def test_a_pushed_job_carries_the_trace_of_its_dispatch(lua: Lua, listen) -> None:
    ear = listen("c1")
    lua.dequeue("c1", limit=2, park=True)
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    lua.dispatch(("a", '"x"', ""), trace=trace)
    lua.add("b")
    jobs = [pushed(d) for ch, d in ear.messages() if ch == "push:c1"]
    assert [(j.id, j.trace, j.data) for j in jobs] == [("a", trace, '"x"'), ("b", "", '"x"')]


def test_a_batch_fills_the_parked_slots_and_the_rest_waits(lua: Lua, listen) -> None:
    ear = listen("c1")
    lua.dequeue("c1", limit=2, park=True)
    codes = lua.dispatch(("a", '"x"', ""), ("b", '"x"', ""), ("c", '"x"', ""))
    assert codes == [Dispatched.CREATED] * 3
    messages = ear.messages()
    assert [pushed(d).id for ch, d in messages if ch == "push:c1"] == ["a", "b"]
    assert ("wake", str(NOW)) in messages
    assert lua.parked() == {}
    assert lua.counts()["waiting"] == 1
    tokens = {pushed(d).token for ch, d in messages if ch == "push:c1"}
    assert len(tokens) == 2  # every push has its own lease token
    assert lua.dequeue("c1").ids == ["c"]


def test_a_delayed_job_is_never_pushed(lua: Lua, listen) -> None:
    ear = listen("c1")
    lua.dequeue("c1", limit=2, park=True)
    lua.add("later", run_at=SOON)
    assert ear.messages() == [("wake", str(SOON))]
    assert lua.get_job("later")["state"] == "delayed"
    assert lua.parked() == {"c1": 2}


def test_a_parked_client_that_does_not_listen_is_unparked_and_the_job_waits(
    lua: Lua, listen
) -> None:
    ear = listen()  # wake channel only: nobody on push:c1
    lua.dequeue("c1", limit=2, park=True)
    lua.add("a")
    assert ear.messages() == [("wake", str(NOW))]
    assert lua.parked() == {}
    assert lua.get_job("a")["state"] == "waiting"
    assert lua.counts()["active"] == 0


def test_a_dead_parked_client_gets_nothing(lua: Lua, listen) -> None:
    ear = listen("c1")
    lua.dequeue("c1", limit=2, park=True, now=NOW - EXPIRY - 1)  # its expiry has passed
    lua.add("a")
    assert ear.messages() == [("wake", str(NOW))]
    assert lua.parked() == {}
    assert lua.get_job("a")["state"] == "waiting"


def test_the_client_with_the_most_parked_slots_gets_the_push(lua: Lua, listen) -> None:
    ear = listen("c1", "c2")
    lua.dequeue("c1", limit=1, park=True)
    lua.dequeue("c2", limit=5, park=True)
    lua.add("a")
    assert [ch for ch, _ in ear.messages()] == ["push:c2"]
    assert lua.parked() == {"c1": 1, "c2": 4}


def test_a_full_dequeue_or_one_without_park_clears_the_parked_slots(lua: Lua, listen) -> None:
    listen("c1")
    lua.dequeue("c1", limit=2, park=True)
    assert lua.parked() == {"c1": 2}
    lua.unpark("c1", "m1")
    lua.dispatch(("a", '"x"', ""), ("b", '"x"', ""))  # nobody parked: both wait
    assert lua.dequeue("c1", limit=2, park=True).ids == ["a", "b"]
    assert lua.parked() == {}
    lua.dequeue("c1", limit=2, park=True)
    lua.dequeue("c1", limit=2)
    assert lua.parked() == {}


def test_unpark_leave_and_a_sweep_clear_the_parked_slots(lua: Lua, listen) -> None:
    listen("c1", "c2")
    lua.dequeue("c1", limit=2, park=True)
    assert lua.unpark("c1", "m1") == [1, 1]  # had slots; one receiver of the mark
    assert lua.parked() == {}
    assert lua.unpark("c3", "m2") == [0, 0]
    lua.dequeue("c1", limit=2, park=True)
    assert lua.leave("c1") == 0
    assert lua.parked() == {}
    lua.dequeue("c2", limit=2, park=True)
    lua.bump("c1", now=DEAD)  # c2 was last seen at NOW: swept
    assert lua.parked() == {}


def test_a_job_active_elsewhere_is_blocked_not_pushed(lua: Lua, listen) -> None:
    lua.take("a", "c1")
    ear = listen("c2")
    lua.dequeue("c2", limit=2, park=True)
    assert lua.add("a", data='"again"') == Dispatched.BLOCKED
    assert ear.messages() == []
    assert lua.parked() == {"c2": 2}


def test_updating_a_waiting_job_to_ready_pushes_it(lua: Lua, listen) -> None:
    ear = listen("c1")
    lua.add("a", run_at=SOON)
    lua.dequeue("c1", limit=2, park=True)
    assert lua.add("a", data='"now"', run_at="") == Dispatched.UPDATED
    [(channel, data)] = ear.messages()[1:]  # after the wake of the delayed dispatch
    assert channel == "push:c1" and pushed(data).data == '"now"'
    assert lua.counts() == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 1}


def test_a_returned_push_waits_again_without_an_event_and_unparks(lua: Lua, listen) -> None:
    ear = listen("c1")
    lua.dequeue("c1", limit=2, park=True)
    lua.add("a")
    job = pushed(ear.messages()[0][1])
    assert lua.retry("c1", job, job.run_at, kind="return") == Ack.OK
    assert ear.messages() == [("wake", str(NOW))]
    assert lua.events() == []
    assert lua.parked() == {}
    assert lua.get_job("a") == {
        "state": "waiting", "id": "a", "data": '"x"', "run_at": NOW,
        "retry_count": 0, "stall_count": 0, "timeout_count": 0,
    }  # fmt: skip
    assert lua.retry("c1", job, job.run_at, kind="return") == Ack.STALE


def test_a_pushed_job_of_a_swept_client_stalls_like_a_dequeued_one(lua: Lua, listen) -> None:
    ear = listen("c1")
    lua.dequeue("c1", limit=2, park=True)
    lua.add("a")
    job = pushed(ear.messages()[0][1])
    lua.bump("c2", now=DEAD)
    assert lua.get_job("a", now=DEAD)["stall_count"] == 1
    assert lua.finish("c1", job, now=DEAD) == Ack.STALE
    assert [e["outcome"] for e in lua.events()] == ["stalled"]


def test_unpark_publishes_a_mark_after_every_push_before_it(lua: Lua, listen) -> None:
    ear = listen("c1")
    lua.dequeue("c1", limit=2, park=True)
    lua.add("a")
    lua.unpark("c1", "m7")
    lua.add("b")
    messages = ear.messages()
    assert [ch for ch, _ in messages] == ["push:c1", "push:c1", "wake"]
    assert pushed(messages[0][1]).id == "a"
    assert messages[1][1] == "m7"  # a mark has no newline; a pushed job always has six
    assert lua.get_job("b")["state"] == "waiting"


def test_a_pattern_subscriber_is_not_a_listening_client(lua: Lua, redis_url: str) -> None:
    """PUBLISH counts PSUBSCRIBE listeners; a push needs a subscription to the exact channel."""
    with redis.Redis.from_url(redis_url) as conn, conn.pubsub() as pattern:
        pattern.psubscribe(lua.B + ":push:*")
        pattern.get_message(timeout=1.0)  # the psubscribe confirmation
        lua.dequeue("c1", limit=2, park=True)
        assert lua.add("a") == Dispatched.CREATED
        assert lua.get_job("a")["state"] == "waiting"
        assert lua.parked() == {}


@pytest.mark.parametrize(
    "late, pushed_to_it", [(EXPIRY // 2, True), (EXPIRY // 2 + 1, False)], ids=["half", "less"]
)
def test_a_push_goes_only_to_a_client_with_half_its_expiry_left(
    lua: Lua, listen, late: int, pushed_to_it: bool
) -> None:
    """A frozen client keeps its subscription but stops its heartbeat: once less than half of
    its expiry window is left, jobs wait for a client that is really there."""
    listen("c1")
    lua.dequeue("c1", limit=2, park=True)  # alive until NOW + EXPIRY
    lua.dispatch(("a", '"x"', NOW), now=NOW + late)
    assert lua.get_job("a", now=NOW + late)["state"] == ("active" if pushed_to_it else "waiting")
    assert lua.parked() == ({"c1": 1} if pushed_to_it else {})


def test_a_bump_keeps_a_parked_client_fresh(lua: Lua, listen) -> None:
    listen("c1")
    lua.dequeue("c1", limit=2, park=True)
    lua.bump("c1", now=NOW + EXPIRY // 2)
    lua.dispatch(("a", '"x"', NOW), now=NOW + EXPIRY - 1)
    assert lua.get_job("a", now=NOW + EXPIRY - 1)["state"] == "active"


def test_a_trace_written_around_the_library_cannot_shift_a_pushed_jobs_data(
    lua: Lua, listen
) -> None:
    """A push message is newline-separated with the data last: a trace with a newline,
    written into a waiting record by a raw HSET, made the rest of the trace the start of the
    data (the job ran with other data, or data that is not JSON). A trace that is not a
    traceparent's characters (0-9 a-f -) is pushed as none, as a too-long one is."""
    ear = listen("c1")
    lua.add("a", data='{"n": 1}', run_at=SOON)
    records.garble(lua.r, lua.B, "a", "trace", "00-ab\n{}")  # a raw HSET: no check
    lua.dequeue("c1", limit=2, park=True)
    assert lua.add("a", data='{"n": 2}', run_at="") == Dispatched.UPDATED
    [(channel, data)] = ear.messages()[1:]  # after the wake of the delayed dispatch
    job = pushed(data)
    assert channel == "push:c1" and (job.trace, job.data) == ("", '{"n": 2}')


def test_thousands_of_parked_clients_do_not_stop_a_dispatch(lua: Lua, listen) -> None:
    """live_parked read every parked client's freshness with one ZMSCORE of one unpack():
    past Lua's 8,000 values every dispatch of the queue failed ('too many results to
    unpack'), its job not written. Real dequeues park 8,200 clients; the one that listens
    has the most slots and gets the job."""
    ear = listen("c-listens")
    for i in range(8_200):
        assert lua.dequeue(f"c{i}", limit=1, park=True).jobs == []
    assert lua.dequeue("c-listens", limit=3, park=True).jobs == []
    assert len(lua.parked()) == 8_201
    assert lua.add("a") == Dispatched.CREATED
    [(channel, data)] = ear.messages()
    assert channel == "push:c-listens" and pushed(data).id == "a"
    assert lua.get_job("a")["state"] == "active"
    assert lua.parked()["c-listens"] == 2


def test_thousands_of_stale_parked_clients_are_unparked_in_slices(lua: Lua) -> None:
    """The same read when the parked clients went stale (no bump for half their expiry):
    they are dropped from B:parked (its HDEL in slices too) and the job waits."""
    for i in range(8_200):
        assert lua.dequeue(f"c{i}", limit=1, park=True).jobs == []
    later = NOW + EXPIRY // 2 + 1  # past their freshness, before their expiry
    assert lua.add("a", run_at=later, now=later) == Dispatched.CREATED
    assert lua.parked() == {}
    assert lua.counts(later) == {"waiting": 1, "delayed": 0, "blocked": 0, "active": 0}
