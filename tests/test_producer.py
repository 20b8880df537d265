"""The producer API (Client, Queue) against a real server.

Jobs are made active with a raw dequeue FCALL (lua_calls.py): the supervisor is not needed here.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from urllib.parse import quote

import psutil
import pytest
import redis
from lua_calls import COUNTS, Leased, Lua, live

from queasy_py import Client, InvalidInput, JobInfo, Queue
from queasy_py.encoded import dispatch_encoded_stream
from queasy_py.queue_base import DISPATCH_CHUNK
from queasy_py.store.library import Dispatched

URL_SAFE = re.compile(r"[A-Za-z0-9_-]+")
IN_AN_HOUR = float(int(time.time()) + 3600)  # whole seconds: survives the ms round trip
RUN_AT_MODES = {
    True: lambda current, new: new,
    False: lambda current, new: current,
    "if_later": max,
    "if_earlier": min,
}


@pytest.fixture
def client(redis_url: str, prefix: str) -> Iterator[Client]:
    with Client(redis_url, prefix=prefix) as c:
        yield c


@pytest.fixture
def q(client: Client) -> Queue:
    return client.queue("emails")


@pytest.fixture
def lua(r: redis.Redis, prefix: str) -> Lua:
    return Lua(r, prefix, "emails")


def now_ms() -> int:
    return int(time.time() * 1000)


def checkout(lua: Lua, limit: int = 1) -> list[Leased]:
    """Make up to `limit` ready jobs active for client c1 (a raw dequeue at the real time)."""
    return lua.dequeue("c1", limit=limit, now=now_ms()).jobs


def stored(q: Queue, job_id: str) -> JobInfo:
    job = q.get_job(job_id)
    assert job is not None, f"job {job_id!r} is missing"
    return job


# ---------------------------------------------------------------- dispatch and get_job


def test_dispatch_returns_unique_url_safe_ids(q: Queue) -> None:
    ids = [q.dispatch(n) for n in range(200)]
    assert len(set(ids)) == len(ids)
    for job_id in ids:
        assert URL_SAFE.fullmatch(job_id) and quote(job_id, safe="") == job_id


def test_dispatch_with_an_id_returns_that_id(q: Queue) -> None:
    assert q.dispatch({"to": "a@example.com"}, id="welcome:42") == "welcome:42"
    assert stored(q, "welcome:42").data == {"to": "a@example.com"}


def test_get_job_of_a_waiting_job(q: Queue) -> None:
    before = time.time()
    job_id = q.dispatch({"to": "a@example.com", "n": [1, 2.5, None, True]})
    job = stored(q, job_id)
    assert isinstance(job, JobInfo)
    assert (job.id, job.queue, job.state) == (job_id, "emails", "waiting")
    assert job.data == {"to": "a@example.com", "n": [1, 2.5, None, True]}
    assert before - 1 <= job.run_at <= time.time() + 1
    assert (job.retry_count, job.stall_count, job.timeout_count) == (0, 0, 0)


def test_get_job_of_a_delayed_job(q: Queue) -> None:
    job = stored(q, q.dispatch("x", run_at=IN_AN_HOUR))
    assert (job.state, job.run_at) == ("delayed", IN_AN_HOUR)


def test_get_job_of_an_active_job(q: Queue, lua: Lua) -> None:
    job_id = q.dispatch("x")
    checkout(lua)
    assert stored(q, job_id).state == "active"


def test_get_job_of_an_unknown_id_is_none(q: Queue) -> None:
    assert q.get_job("nope") is None


def test_counts_per_state(q: Queue, lua: Lua) -> None:
    assert live(q.counts()) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}
    q.dispatch("x", id="a")
    checkout(lua)
    q.dispatch("x", id="a")  # blocked behind the active one
    q.dispatch("x")
    q.dispatch("x")
    q.dispatch("x", delay=3600)
    assert q.counts() == {"waiting": 2, "delayed": 1, "blocked": 1, "active": 1} | {
        name: 0
        for name in COUNTS[4:]  # nothing ended yet
    }


def test_queues_are_separate(client: Client) -> None:
    client.queue("a").dispatch("x")
    assert client.queue("b").counts()["waiting"] == 0


# ---------------------------------------------------------------- run_at and delay


@pytest.mark.parametrize(
    "run_at",
    [
        datetime(2033, 5, 18, 3, 33, 20, tzinfo=UTC),
        datetime(2033, 5, 18, 5, 33, 20, tzinfo=timezone(timedelta(hours=2))),
    ],
    ids=["utc", "plus_2h"],
)
def test_run_at_as_an_aware_datetime(q: Queue, run_at: datetime) -> None:
    job = stored(q, q.dispatch("x", run_at=run_at))
    assert (job.state, job.run_at) == ("delayed", 2_000_000_000.0)


def test_run_at_as_epoch_seconds(q: Queue) -> None:
    job = stored(q, q.dispatch("x", run_at=2_000_000_000.5))
    assert (job.state, job.run_at) == ("delayed", 2_000_000_000.5)


def test_a_run_at_between_two_milliseconds_is_never_due_early(q: Queue) -> None:
    # the library keeps whole ms: the next one, never the one before the time asked
    assert stored(q, q.dispatch("x", run_at=2_000_000_000.0005)).run_at == 2_000_000_000.001
    assert stored(q, q.dispatch("x", run_at=2_000_000_000.001)).run_at == 2_000_000_000.001
    assert stored(q, q.dispatch("x", run_at=1_999_999_999.9999)).run_at == 2_000_000_000.0
    due = 2_000_000_000 + 0.0005
    many = q.dispatch_many([{"data": i, "run_at": due} for i in range(3)])
    assert {stored(q, job_id).run_at for job_id in many} == {2_000_000_000.001}


def test_run_at_in_the_past_is_ready(q: Queue, lua: Lua) -> None:
    job_id = q.dispatch("x", run_at=1_000_000_000)
    assert stored(q, job_id).state == "waiting"
    assert [job.id for job in checkout(lua)] == [job_id]


def test_delay_is_seconds_from_now(q: Queue) -> None:
    before = time.time()
    job = stored(q, q.dispatch("x", delay=90.5))
    assert job.state == "delayed"
    assert before + 90.5 - 0.01 <= job.run_at <= time.time() + 90.5


# ---------------------------------------------------------------- update by id


def waiting_retried_once(q: Queue, lua: Lua, job_id: str, run_at: float) -> None:
    """Leave job `job_id` waiting at run_at with data 'old' and retry_count 1."""
    q.dispatch("old", id=job_id)
    (job,) = checkout(lua)
    lua.retry("c1", job, run_at=int(run_at * 1000))


@pytest.mark.parametrize("offset", [-1800, 1800], ids=["earlier", "later"])
@pytest.mark.parametrize(
    "reset_counts", [None, True, False], ids=["reset_default", "reset", "keep"]
)
@pytest.mark.parametrize("update_run_at", RUN_AT_MODES, ids=str)
@pytest.mark.parametrize("update_data", [True, False], ids=["data", "no_data"])
def test_dispatch_with_an_existing_id_updates_per_flags(
    q: Queue,
    lua: Lua,
    update_data: bool,
    update_run_at: bool | str,
    reset_counts: bool | None,
    offset: int,
) -> None:
    waiting_retried_once(q, lua, "a", IN_AN_HOUR)
    new_run_at = IN_AN_HOUR + offset
    q.dispatch(
        "new",
        id="a",
        run_at=new_run_at,
        update_data=update_data,
        update_run_at=update_run_at,
        reset_counts=reset_counts,
    )
    job = stored(q, "a")
    assert job.data == ("new" if update_data else "old")
    assert job.run_at == RUN_AT_MODES[update_run_at](IN_AN_HOUR, new_run_at)
    resets = update_data if reset_counts is None else reset_counts
    assert job.retry_count == (0 if resets else 1)
    assert q.counts()["delayed"] == 1


def test_dispatch_with_the_id_of_an_active_job_blocks_behind_it(q: Queue, lua: Lua) -> None:
    q.dispatch("first", id="a")
    (active,) = checkout(lua)
    q.dispatch("second", id="a")
    assert stored(q, "a").data == "first"
    lua.finish("c1", active, now=now_ms())
    assert (stored(q, "a").state, stored(q, "a").data) == ("waiting", "second")


# ---------------------------------------------------------------- dispatch_many


def test_dispatch_many_returns_ids_in_order(q: Queue) -> None:
    ids = q.dispatch_many([{"data": 1, "id": "one"}, {"data": 2}, {"data": 3, "id": "three"}])
    assert ids[0] == "one" and ids[2] == "three"
    assert URL_SAFE.fullmatch(ids[1])
    assert [stored(q, job_id).data for job_id in ids] == [1, 2, 3]


def test_dispatch_many_with_run_at_and_delay(q: Queue) -> None:
    ids = q.dispatch_many(
        [{"data": "now"}, {"data": "at", "run_at": IN_AN_HOUR}, {"data": "in", "delay": 60}]
    )
    assert [stored(q, job_id).state for job_id in ids] == ["waiting", "delayed", "delayed"]
    assert stored(q, ids[1]).run_at == IN_AN_HOUR


def test_dispatch_many_of_nothing_is_empty(q: Queue) -> None:
    assert q.dispatch_many([]) == []


def test_dispatch_many_applies_the_update_flags(q: Queue) -> None:
    q.dispatch("old", id="a")
    q.dispatch_many([{"data": "new", "id": "a"}, {"data": "b", "id": "b"}], update_data=False)
    assert stored(q, "a").data == "old"
    assert q.counts()["waiting"] == 2


def test_dispatch_many_chunks_thousands_of_jobs(q: Queue, lua: Lua) -> None:
    count = 2_000
    assert count > DISPATCH_CHUNK
    ids = q.dispatch_many({"data": {"n": n}} for n in range(count))
    assert len(set(ids)) == count
    assert q.counts()["waiting"] == count
    for n in (0, DISPATCH_CHUNK, count - 1):
        assert stored(q, ids[n]).data == {"n": n}


# ---------------------------------------------------------------- cancel


def test_cancel_removes_a_waiting_job(q: Queue) -> None:
    job_id = q.dispatch("x", delay=60)
    assert q.cancel(job_id) is True
    assert q.get_job(job_id).state == "cancelled"  # type: ignore[union-attr]
    assert q.counts()["delayed"] == 0
    assert q.cancel(job_id) is False


def test_cancel_of_an_unknown_id_is_false(q: Queue) -> None:
    assert q.cancel("nope") is False


def test_cancel_never_touches_an_active_job(q: Queue, lua: Lua) -> None:
    job_id = q.dispatch("x")
    checkout(lua)
    assert q.cancel(job_id) is False
    assert stored(q, job_id).state == "active"


# ---------------------------------------------------------------- client lifetime


def test_client_as_a_context_manager_closes_its_connection(
    redis_url: str, prefix: str, r: redis.Redis
) -> None:
    with Client(redis_url, prefix=prefix) as c:
        c.queue("emails").dispatch("x")
        conn_id = c.redis.client_id()
    deadline = time.monotonic() + 5.0  # the server notices a closed socket on its next loop
    while conn_id in {int(info["id"]) for info in r.client_list()}:
        assert time.monotonic() < deadline, "the client's connection is still open"
        time.sleep(0.01)


def test_client_without_a_url_starts_and_stops_an_embedded_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.delenv("QUEASY_REDIS_URL", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.setenv("QUEASY_DATA_DIR", str(tmp_path) + "/project")  # not the repo's .queasy/
    c = Client()
    try:
        assert c.server is not None and c.url == c.server.url
        pid = c.server.pid
        job_id = c.queue("emails").dispatch("x")
        assert stored(c.queue("emails"), job_id).data == "x"
    finally:
        c.close()
    assert c.server is None
    assert not psutil.pid_exists(pid)


def test_the_encoded_stream_sends_a_batch_before_taking_the_next(q: Queue) -> None:
    """dispatch_encoded_stream (the Spark sink's) takes batch k+1 from its iterable while
    batch k is sent and its replies not read yet, then yields each batch's codes in order; a
    batch the library refuses is InvalidInput, and the connection goes on working after."""
    results: list = []
    taken_after: list[int] = []  # results received when each batch was taken

    def batches() -> Iterator[list]:
        for k in range(3):
            taken_after.append(len(results))
            yield [x for i in range(600) for x in (f"b{k}-{i % 550}", b'{"k":%d}' % k, "")]

    for result in dispatch_encoded_stream(q, batches(), dedup_window=60.0):
        results.append(result)
    assert taken_after == [0, 0, 1]  # one batch ahead
    assert [(r.created, r.updated, len(r.ids)) for r in results] == [(550, 50, 600)] * 3
    assert q.counts()["waiting"] == 1650
    assert stored(q, "b2-7").data == {"k": 2}

    # the first FCALL of the second batch refused: its second FCALL's reply is left unread
    bad = [x for i in range(600) for x in (f"c-{i}", b"{}", "not ms" if i == 3 else "")]
    with pytest.raises(InvalidInput, match="run_at"):
        list(dispatch_encoded_stream(q, [["ok-0", b"{}", ""], bad]))
    (again,) = dispatch_encoded_stream(q, [["ok-3", b"{}", ""]])
    assert (again.ids, again.codes) == (["ok-3"], [Dispatched.CREATED])
    assert stored(q, "ok-3").data == {}
    # ok-0, ok-3 and the 100 jobs of the refused batch's second FCALL (each FCALL is checked
    # alone, as in dispatch_batch)
    assert q.counts()["waiting"] == 1650 + 102


def test_threads_that_end_do_not_each_keep_a_connection(client: Client, q: Queue, r) -> None:
    """dispatch() keeps one connection per thread (store/calls.py FastCall); one of a
    thread that ended went back to nowhere: a thread per request (a threaded web server)
    left one open connection per thread ever started, up to the server's maxclients."""
    import threading

    q.dispatch(0)  # the main thread's connection
    before = len(r.client_list())
    for i in range(40):
        thread = threading.Thread(target=q.dispatch, args=(i,))
        thread.start()
        thread.join()
    assert q.counts()["waiting"] == 41
    assert len(r.client_list()) <= before + 2


def test_every_dispatch_path_lists_its_queue(client: Client) -> None:
    """README: client.queues() (so `queasy status` and the dashboard) lists a queue from its
    first dispatch. dispatch_batch and the Spark sink's encoded paths are dispatches too: a
    queue only the sink fed, no supervisor up yet, was missing from all three."""
    from queasy_py.encoded import dispatch_encoded

    client.queue("batch").dispatch_batch([{"data": 1}])
    client.queue("once").dispatch_batch([{"data": 1, "id": "a"}], dedup_window=60.0)
    dispatch_encoded(client.queue("sink"), ["a", b"{}", ""])
    list(dispatch_encoded_stream(client.queue("stream"), [["a", b"{}", ""]]))
    client.queue("empty").dispatch_batch([])  # nothing dispatched: not listed
    list(dispatch_encoded_stream(client.queue("none"), []))
    assert client.queues() == ["batch", "once", "sink", "stream"]


def test_more_threads_than_redis_pys_default_pool_all_get_a_connection(q: Queue) -> None:
    """A threaded web server with 120 threads in result() on one Client: each gets its
    connection. redis-py 6+ caps a pool at 100 and refuses the 101st call at once
    (redis.MaxConnectionsError 'Too many connections', not even a QueasyError)."""
    import threading

    later = q.dispatch(1, delay=3600)
    start = threading.Barrier(120)
    outcomes: list[str] = []

    def wait() -> None:
        start.wait()
        try:
            q.result(later, timeout=0.5)
        except Exception as exc:
            outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=wait) for _ in range(120)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes == ["ResultTimeout"] * 120


def test_a_forked_child_dispatches_on_connections_of_its_own(client: Client, q: Queue) -> None:
    """A process forked after its parent used the Client (a pre-forking server, a
    multiprocessing fork) sent its writes on the parent's socket: the forking thread's
    FastCall connection is in the child's copy of its thread-local storage. The two
    processes' commands interleaved on it: each could read the other's replies, or the
    server closed the connection on the garbled protocol ('may have applied it')."""
    import os

    from runtime_helpers import wait_for

    q.dispatch(0, id="parent")  # the parent's connection (FastCall, this thread's)
    parent = client.fastcall.command("CLIENT", "ID")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            child = client.fastcall.command("CLIENT", "ID")
            q.dispatch_many([{"data": i} for i in range(DISPATCH_CHUNK + 1)])
            os.write(write, f"{child}".encode())
        except BaseException as exc:
            os.write(write, repr(exc).encode())
        finally:
            os._exit(0)
    os.close(write)
    wait_for(lambda: os.waitpid(pid, os.WNOHANG)[0] == pid, what="the child's end")
    with os.fdopen(read) as said:
        told = said.read()
    assert told != str(parent), "the child sent on its parent's connection"
    assert told.isdigit(), told
    assert client.fastcall.command("CLIENT", "ID") == parent  # the parent's: in step
    assert q.cancel("nothing") is False
    assert q.counts()["waiting"] == DISPATCH_CHUNK + 2
