"""result() learns of its job's end within a bounded time whatever runs the job, with real
supervisors and workers, sync and async: also when the end wakes nothing (README "Inspecting
and operating (API)", result()). A waiter on the job's channel, which only supervisors that
store results publish, sees an end run by a supervisor without store_results started during
the wait (a rolling deploy), then moves to the outcome events; a waiter on a queue with
neither results nor events sees the end at its next look."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
from runtime_helpers import Runtime, queue_spec, wait_for

from queasy_py import Client, defaults
from queasy_py.aio import AsyncClient
from queasy_py.errors import ClientClosed, JobFailed, JobNotFound, ResultTimeout
from queasy_py.store.keys import QueueKeys

RETURNS = "tests.runtime_handlers.returns"
#: the longest a waiter may take to see an end that woke nothing, with room for a loaded machine
SEEN_WITHIN = defaults.RESULT_RECHECK + 2.0
#: result()'s own timeout: what a waiter that missed the end would wait out
TIMEOUT = 60.0


class Waiting:
    """result(job_id) of queue r, waited for in a thread by a Queue ('sync') or an
    AsyncQueue ('async') of a client of its own."""

    def __init__(self, rt: Runtime, job_id: str, how: str) -> None:
        self.got: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, args=(rt, job_id, how), daemon=True)
        self.thread.start()

    def _run(self, rt: Runtime, job_id: str, how: str) -> None:
        try:
            if how == "sync":
                with Client(rt.url, workers=0, prefix=rt.prefix) as client:
                    self.got["value"] = client.queue("r").result(job_id, timeout=TIMEOUT)
            else:
                self.got["value"] = asyncio.run(self._wait_async(rt, job_id))
        except Exception as exc:  # the test reports it
            self.got["error"] = exc
        self.got["at"] = time.time()

    @staticmethod
    async def _wait_async(rt: Runtime, job_id: str) -> Any:
        async with AsyncClient(rt.url, prefix=rt.prefix) as client:
            return await client.queue("r").result(job_id, timeout=TIMEOUT)

    def value(self, within: float) -> Any:
        """What result() returned, once it did (within `within` seconds from now)."""
        self.thread.join(within)
        assert not self.thread.is_alive(), f"result() did not see the end within {within}s"
        assert "error" not in self.got, self.got["error"]
        return self.got["value"]

    def error(self, within: float) -> Exception:
        """What result() raised, once it did (within `within` seconds from now)."""
        self.thread.join(within)
        assert not self.thread.is_alive(), f"result() did not see the end within {within}s"
        assert "error" in self.got, f"result() returned {self.got.get('value')!r}"
        return self.got["error"]


def on_channel(rt: Runtime, job_id: str) -> bool:
    """Whether a waiter listens on the end channel of job `job_id` of queue r."""
    channel = QueueKeys(rt.prefix, "r", "r").done(job_id)
    return bool(rt.r.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1])


def reading_events(rt: Runtime) -> bool:
    """Whether a client waits in XREAD BLOCK (the session's server: this test's waiter)."""
    return any(c.get("cmd") == "xread" and "b" in c.get("flags", "") for c in rt.r.client_list())


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_waiter_on_the_channel_sees_ends_run_by_a_supervisor_storing_no_results(
    rt: Runtime, how: str
) -> None:
    storing = rt.start({"r": queue_spec(RETURNS, store_results=True)})
    q = rt.queue("r")
    wait_for(lambda: q.client.supervisors(), what="the storing supervisor's registry entry")
    for job_id in ("early", "late"):
        q.dispatch({"tag": job_id, "value": job_id}, id=job_id, delay=3600)
    early, late = Waiting(rt, "early", how), Waiting(rt, "late", how)
    wait_for(
        lambda: on_channel(rt, "early") and on_channel(rt, "late"),
        what="both waiters on their job's channel (every supervisor of r stores results)",
    )
    assert storing.stop() == 0
    rt.start({"r": queue_spec(RETURNS)})  # a rolling deploy: results off now
    wait_for(lambda: q.client.supervisors(), what="the new supervisor's registry entry")
    q.dispatch({"tag": "early", "value": "early"}, id="early")  # now: it runs at once
    (ended,) = rt.wait_records(1, "end", tag="early")
    assert early.value(within=SEEN_WITHIN + 5.0) is None  # nothing PUBLISHed its end
    delay = early.got["at"] - ended["t"]
    assert delay < SEEN_WITHIN, f"the waiter saw the end {delay:.3f}s after it"
    # the other waiter left the channel for the outcome events at its look: woken at once
    wait_for(
        lambda: not on_channel(rt, "late"),
        timeout=SEEN_WITHIN,
        what="the waiter of 'late' moving to the outcome events",
    )
    q.dispatch({"tag": "late", "value": "late"}, id="late")
    (finished,) = (e for e in rt.wait_events("r", 2) if e["id"] == "late")
    assert late.value(within=SEEN_WITHIN) is None
    delay = late.got["at"] - int(finished["ended_at"]) / 1000
    assert delay < 1.0, f"the waiter woke {delay:.3f}s after the finish"


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_waiter_sees_an_end_on_a_queue_with_neither_results_nor_events(
    rt: Runtime, how: str
) -> None:
    rt.start({"r": queue_spec(RETURNS, events_maxlen=0)})
    q = rt.queue("r")
    q.dispatch({"tag": "e", "gate": "e", "value": 1}, id="e")
    rt.wait_records(1, "start", tag="e")
    waiting = Waiting(rt, "e", how)
    wait_for(lambda: reading_events(rt), what="the waiter blocked on the outcome events")
    rt.open_gate("e")
    (ended,) = rt.wait_records(1, "end", tag="e")
    assert waiting.value(within=SEEN_WITHIN + 5.0) is None
    delay = waiting.got["at"] - ended["t"]
    assert delay < SEEN_WITHIN, f"the waiter saw the end {delay:.3f}s after it"
    assert rt.events("r") == []  # no event was written: the waiter's look saw the end


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_waiter_on_a_resp3_url_is_woken_by_the_outcome_event(
    redis_url: str, prefix: str, how: str
) -> None:
    """A `?protocol=3` URL (redis-py takes it): XREAD replies a map there, not RESP2's list of
    [key, entries]; the waiter on the outcome events took reply[0][1] and failed with a bare
    KeyError 0 when the job's event came. Here the job is cancelled while it waits."""
    url = redis_url + ("&" if "?" in redis_url else "?") + "protocol=3"
    with Client(redis_url, workers=0, prefix=prefix) as plain:
        plain.queue("r").dispatch({}, id="c", delay=3600)
        threading.Timer(0.5, plain.queue("r").cancel, ["c"]).start()

        def wait() -> Any:
            if how == "sync":
                with Client(url, workers=0, prefix=prefix) as client:
                    return client.queue("r").result("c", timeout=TIMEOUT)

            async def wait_async() -> Any:
                async with AsyncClient(url, prefix=prefix) as client:
                    return await client.queue("r").result("c", timeout=TIMEOUT)

            return asyncio.run(wait_async())

        started = time.monotonic()
        with pytest.raises(JobFailed, match="cancelled"):
            wait()
        assert time.monotonic() - started < SEEN_WITHIN


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_waiter_on_the_events_keeps_under_the_urls_socket_timeout(
    redis_url: str, prefix: str, how: str
) -> None:
    """A URL's `?socket_timeout=` wins over SOCKET_TIMEOUT (README); one below EVENT_BLOCK
    (2 s) made the waiter's XREAD BLOCK outlast it: result() failed after 0.5 s with redis-py's
    bare TimeoutError ('Timeout reading from socket') instead of waiting out its own timeout."""
    url = redis_url + ("&" if "?" in redis_url else "?") + "socket_timeout=0.5"
    with Client(redis_url, workers=0, prefix=prefix) as plain:
        plain.queue("r").dispatch({}, id="later", delay=3600)

    def wait() -> Any:
        if how == "sync":
            with Client(url, workers=0, prefix=prefix) as client:
                return client.queue("r").result("later", timeout=1.5)

        async def wait_async() -> Any:
            async with AsyncClient(url, prefix=prefix) as client:
                return await client.queue("r").result("later", timeout=1.5)

        return asyncio.run(wait_async())

    started = time.monotonic()
    with pytest.raises(ResultTimeout):
        wait()
    assert time.monotonic() - started >= 1.5


def waiting_on(rt: Runtime, mode: str, job_id: str) -> bool:
    """Whether a waiter waits for job `job_id` of queue r by `mode` (channel or events)."""
    return on_channel(rt, job_id) if mode == "channel" else reading_events(rt)


@pytest.mark.parametrize("how", ["sync", "async"])
@pytest.mark.parametrize("mode", ["channel", "events"])
def test_closing_the_client_ends_a_waiter_with_client_closed(
    rt: Runtime, mode: str, how: str
) -> None:
    """close() while another thread (or task) waits in result() for a job that never ends:
    the waiter raised what its connection, closed under it, made redis-py raise (a bare
    ConnectionError 'Bad file descriptor', on the channel even a TypeError from its select).
    It ends with ClientClosed (a ConnectionFailed, so a QueasyError) naming the job."""
    if mode == "channel":  # every supervisor of r stores results: the waiter takes the channel
        rt.start({"r": queue_spec(RETURNS, store_results=True)})
        wait_for(lambda: rt.queue("r").client.supervisors(), what="the supervisor's entry")
    rt.queue("r").dispatch({}, id="never", delay=3600)
    got: dict[str, Any] = {}

    def wait_sync() -> None:
        client = Client(rt.url, workers=0, prefix=rt.prefix)
        closing = threading.Thread(target=close_when_waiting, args=(client.close,))
        closing.start()
        try:
            got["value"] = client.queue("r").result("never", timeout=TIMEOUT)
        except Exception as exc:
            got["error"] = exc
        closing.join()

    def close_when_waiting(close: Any) -> None:
        wait_for(lambda: waiting_on(rt, mode, "never"), what=f"the waiter on the {mode}")
        close()

    async def wait_async() -> None:
        client = AsyncClient(rt.url, prefix=rt.prefix)
        waiter = asyncio.ensure_future(client.queue("r").result("never", timeout=TIMEOUT))
        await asyncio.to_thread(wait_for, lambda: waiting_on(rt, mode, "never"))
        await client.close()
        try:
            got["value"] = await asyncio.wait_for(waiter, SEEN_WITHIN)
        except Exception as exc:
            got["error"] = exc

    started = time.monotonic()
    thread = threading.Thread(
        target=wait_sync if how == "sync" else lambda: asyncio.run(wait_async()), daemon=True
    )
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "result() went on waiting after close()"
    assert "value" not in got, got
    error = got["error"]
    assert isinstance(error, ClientClosed), f"{type(error).__name__}: {error}"
    assert "closed while result() waited for job never of r" in str(error)
    assert time.monotonic() - started < 15


@pytest.mark.parametrize("how", ["sync", "async"])
def test_an_end_while_the_subscription_is_on_its_way_is_seen_at_once(
    rt: Runtime, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window between a waiter's SSUBSCRIBE and the server taking it: the job ends
    there, its message published to no one. Forced here: the SSUBSCRIBE is held back on
    its way to the (real) server until the waiter first reads its pub/sub connection, after
    its first look at the job; then the job ends, and only then is the SSUBSCRIBE sent. The
    waiter is not left for RESULT_RECHECK: the subscription's confirmation ends its first
    wait (redis-py returns after one reply, a confirmation too), and it looks again."""
    import redis.asyncio.client as aioclient

    rt.start({"r": queue_spec(RETURNS, store_results=True)})
    q = rt.queue("r")
    wait_for(lambda: q.client.supervisors(), what="the supervisor's registry entry")
    q.dispatch({"tag": "j", "gate": "j", "value": 7}, id="j")
    rt.wait_records(1, "start", tag="j")
    held: list[tuple[Any, tuple]] = []
    seen: list[str] = []  # the job's state when the held SSUBSCRIBE went

    def end_the_job() -> None:
        seen.append(q.get_job("j").state)
        rt.open_gate("j")
        wait_for(lambda: q.get_job("j").state == "finished", what="the job's end")

    PubSub = redis.client.PubSub if how == "sync" else aioclient.PubSub
    send, read = PubSub.execute_command, PubSub.parse_response

    def held_send(self: Any, *args: Any) -> Any:
        if args[0] == "SSUBSCRIBE":
            return held.append((self, args))
        return send(self, *args)

    def late_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        while held:
            end_the_job()
            pubsub, command = held.pop()
            send(pubsub, *command)
        return read(self, *args, **kwargs)

    async def held_send_async(self: Any, *args: Any) -> Any:
        if args[0] == "SSUBSCRIBE":
            return held.append((self, args))
        return await send(self, *args)

    async def late_read_async(self: Any, *args: Any, **kwargs: Any) -> Any:
        while held:
            end_the_job()
            pubsub, command = held.pop()
            await send(pubsub, *command)
        return await read(self, *args, **kwargs)

    sync = how == "sync"
    monkeypatch.setattr(PubSub, "execute_command", held_send if sync else held_send_async)
    monkeypatch.setattr(PubSub, "parse_response", late_read if sync else late_read_async)
    started = time.monotonic()
    if sync:
        with Client(rt.url, workers=0, prefix=rt.prefix) as client:
            value = client.queue("r").result("j", timeout=TIMEOUT)
    else:
        value = asyncio.run(Waiting._wait_async(rt, "j"))
    took = time.monotonic() - started
    assert value == 7
    assert seen == ["active"], "the SSUBSCRIBE was not held while the job ran"
    assert took < defaults.RESULT_RECHECK / 2, f"result() took {took:.3f}s"


def test_closing_an_async_client_ends_its_waiter_before_its_connections(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AsyncClient.close() under a result() waiter: the waiter's connection, closed under
    its read, was opened again by redis-py's retry while the pool closed it, and the two
    could leave a connected socket to the collector ('unclosed Connection', a flake of the
    test above). close() now ends its waiters first: no connection is opened after it.
    On the channel: its pub/sub read is what redis-py retries (an XREAD is not)."""
    import redis.asyncio.connection as aioconnection

    rt.start({"r": queue_spec(RETURNS, store_results=True)})
    wait_for(lambda: rt.queue("r").client.supervisors(), what="the supervisor's entry")
    rt.queue("r").dispatch({}, id="never", delay=3600)
    closing = threading.Event()
    opened_after: list[str] = []
    connect = aioconnection.AbstractConnection.connect

    async def spied_connect(self: Any) -> None:
        if closing.is_set() and not self.is_connected:
            opened_after.append(repr(self))
        await connect(self)

    monkeypatch.setattr(aioconnection.AbstractConnection, "connect", spied_connect)
    got: dict[str, Any] = {}

    async def wait_async() -> None:
        client = AsyncClient(rt.url, prefix=rt.prefix)
        waiter = asyncio.ensure_future(client.queue("r").result("never", timeout=TIMEOUT))
        await asyncio.to_thread(wait_for, lambda: waiting_on(rt, "channel", "never"))
        closing.set()
        await client.close()
        try:
            got["value"] = await asyncio.wait_for(waiter, SEEN_WITHIN)
        except Exception as exc:
            got["error"] = exc

    thread = threading.Thread(target=lambda: asyncio.run(wait_async()), daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "result() went on waiting after close()"
    assert isinstance(got.get("error"), ClientClosed), got
    assert opened_after == [], f"connections opened after close(): {opened_after}"


# ------------------------------------------- an end seen, its record gone by the next look
#: a retention that keeps no record of an end (removeOnComplete in BullMQ's words)
KEEP_NONE = {"count": 0, "seconds": 0}


def gated_and_waited(rt: Runtime, how: str, data: Any, **spec: Any) -> tuple[Any, Waiting]:
    """A supervisor of r (`spec`), job 'g' of r (`data`, and a gate) running behind its
    gate, and a waiter of it woken by its end (on its channel with store_results, else on
    the outcome events)."""
    rt.start({"r": queue_spec(RETURNS, **spec)})
    q = rt.queue("r")
    wait_for(lambda: q.client.supervisors(), what="the supervisor's registry entry")
    q.dispatch({"tag": "g", "gate": "g", **data}, id="g")
    rt.wait_records(1, "start", tag="g")
    waiting = Waiting(rt, "g", how)
    channel = spec.get("store_results")
    wait_for(
        lambda: on_channel(rt, "g") if channel else reading_events(rt),
        what="the waiter waiting for the end of g",
    )
    return q, waiting


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_waiter_that_saw_its_job_finish_returns_though_no_record_is_kept(
    rt: Runtime, how: str
) -> None:
    """keep_finished of count 0 keeps no record of a finished job: the waiter's look after
    the end found nothing and raised JobNotFound ('never dispatched') for a job it saw end,
    so result() could not serve as 'wait until done' on such a queue."""
    q, waiting = gated_and_waited(rt, how, {"value": 7}, keep_finished=KEEP_NONE)
    rt.open_gate("g")
    assert waiting.value(within=SEEN_WITHIN) is None  # the queue stores no results
    assert q.get_job("g") is None  # no record was kept: the end seen answered


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_waiter_that_saw_its_job_fail_raises_job_failed_though_no_record_is_kept(
    rt: Runtime, how: str
) -> None:
    data = {"raise": "permanent", "message": "no"}
    q, waiting = gated_and_waited(rt, how, data, keep_failed=KEEP_NONE)
    rt.open_gate("g")
    error = waiting.error(within=SEEN_WITHIN)
    assert isinstance(error, JobFailed), repr(error)
    assert (error.error["name"], error.error["message"]) == ("PermanentError", "no")
    assert error.error["kind"] == "permanent" and "PermanentError: no" in error.error["traceback"]
    assert error.job.state == "failed" and error.job.id == "g" and error.job.queue == "r"
    assert error.job.ended_at is not None and error.job.worker_pid is not None
    assert "keep_failed" in str(error)
    assert q.get_job("g") is None


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_waiter_whose_finished_jobs_result_was_not_kept_is_told_so(rt: Runtime, how: str) -> None:
    """With store_results and keep_finished of count 0 the result is gone with the record:
    JobNotFound naming keep_finished, never a None that was not the handler's value."""
    spec = {"keep_finished": KEEP_NONE, "store_results": True}
    _, waiting = gated_and_waited(rt, how, {"value": 7}, **spec)
    rt.open_gate("g")
    error = waiting.error(within=SEEN_WITHIN)
    assert isinstance(error, JobNotFound), repr(error)
    assert "finished, but its record, with its result, is no longer kept" in str(error)
    assert "keep_finished" in str(error)


# ------------------------------------- the id live again: the end of the job waited for
@pytest.mark.parametrize(
    ("how", "results"), [("sync", True), ("async", True), ("sync", False), ("async", False)]
)
def test_a_waiter_gets_the_end_of_its_job_though_a_twin_with_its_id_runs_next(
    rt: Runtime, how: str, results: bool
) -> None:
    """A dispatch of an active id blocks behind it and becomes live at its end: the waiter
    looked again, found the twin live and waited for it (for ever, where a job dispatches
    itself again, or a schedule's next occurrence follows); it gets the end it saw."""
    rt.start({"r": queue_spec(RETURNS, store_results=results)})
    q = rt.queue("r")
    wait_for(lambda: q.client.supervisors(), what="the supervisor's registry entry")
    q.dispatch({"tag": "first", "gate": "first", "value": 1}, id="p")
    rt.wait_records(1, "start", tag="first")
    waiting = Waiting(rt, "p", how)
    wait_for(
        lambda: on_channel(rt, "p") if results else reading_events(rt),
        what="the waiter waiting for the end of p",
    )
    q.dispatch({"tag": "twin", "gate": "twin", "value": 2}, id="p")  # blocked behind it
    rt.open_gate("first")
    assert waiting.value(within=SEEN_WITHIN) == (1 if results else None)
    rt.wait_records(1, "start", tag="twin")  # the twin runs (its gate shut)
    assert q.get_job("p").state == "active"


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_waiter_gets_the_failure_of_its_job_though_a_twin_with_its_id_runs_next(
    rt: Runtime, how: str
) -> None:
    rt.start({"r": queue_spec(RETURNS)})
    q = rt.queue("r")
    wait_for(lambda: q.client.supervisors(), what="the supervisor's registry entry")
    q.dispatch({"tag": "first", "gate": "first", "raise": "permanent", "message": "x"}, id="p")
    rt.wait_records(1, "start", tag="first")
    waiting = Waiting(rt, "p", how)
    wait_for(lambda: reading_events(rt), what="the waiter waiting for the end of p")
    q.dispatch({"tag": "twin", "gate": "twin", "value": 2}, id="p")
    rt.open_gate("first")
    error = waiting.error(within=SEEN_WITHIN)
    assert isinstance(error, JobFailed), repr(error)
    assert (error.error["name"], error.error["message"]) == ("PermanentError", "x")
    # its kept record, read from the newest failed ones (without data: a listing's page)
    assert error.job.state == "failed" and error.job.host is not None
    assert error.job.attempts == 1 and error.job.data is None


def test_a_cancelled_twin_is_not_the_end_of_the_active_job_waited_for(rt: Runtime) -> None:
    rt.start({"r": queue_spec(RETURNS, store_results=True)})
    q = rt.queue("r")
    wait_for(lambda: q.client.supervisors(), what="the supervisor's registry entry")
    q.dispatch({"tag": "first", "gate": "first", "value": 1}, id="p")
    rt.wait_records(1, "start", tag="first")
    waiting = Waiting(rt, "p", "sync")
    wait_for(lambda: on_channel(rt, "p"), what="the waiter waiting for the end of p")
    q.dispatch({"tag": "twin", "value": 2}, id="p")  # blocked behind it
    assert q.cancel("p")  # the blocked copy: its channel says 'cancelled'
    time.sleep(0.5)  # (what the waiter does with it: nothing, it waits on)
    assert waiting.thread.is_alive() and not waiting.got
    rt.open_gate("first")
    assert waiting.value(within=SEEN_WITHIN) == 1


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_waiter_of_a_schedules_occurrence_gets_its_end_not_the_nexts(
    rt: Runtime, how: str
) -> None:
    """The next occurrence (the same id) is created as one ends: result('schedule') waited
    for each next one in turn, and never returned."""
    rt.start({"r": queue_spec("tests.runtime_handlers.scheduled", schedule_every=2)})
    q = rt.queue("r")
    wait_for(lambda: (info := q.schedule_info()) and info.state, what="the first occurrence")
    waiting = Waiting(rt, "schedule", how)
    assert waiting.value(within=2.0 + SEEN_WITHIN) is None
    (end,) = rt.records("end")[:1]
    assert waiting.got["at"] - end["t"] < SEEN_WITHIN
