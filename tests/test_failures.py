"""Failures are visible, results kept, operators see (issue #11), with real supervisors and
workers: the log lines of a retry and of a failure for good (with the traceback), the new
event fields, the fail handler's message and traceback, JobInfo.last_error and the state of
each end, results round trips and how fast a waiter wakes, a non-JSON result failing its job
alone, the retention keeping the server's memory flat, and the supervisors' registry."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import threading
import time
from typing import Any

import pytest
import redis
from runtime_helpers import ACT, FAIL_RECORD, ON_CLUSTER, Runtime, queue_spec, wait_for

from queasy_py import Client, JobInfo
from queasy_py.aio import AsyncClient
from queasy_py.errors import JobFailed, JobNotFound, ResultTimeout
from queasy_py.store.keys import QueueKeys

RETURNS = "tests.runtime_handlers.returns"
QUIET = "tests.runtime_handlers.quiet"
FAST = {"min_backoff": 0.05, "max_backoff": 0.1}


def in_log(sup: Any, pattern: str) -> re.Match:
    """Wait for `pattern` (a regex, multi-line) to appear in the supervisor's log."""
    return wait_for(lambda: re.search(pattern, sup.log(), re.MULTILINE), what=pattern)


def ms(value: str) -> float:
    return int(value) / 1000


# ---------------------------------------------------------------- failures are visible


def test_a_retried_then_failed_job_shows_its_error_and_traceback_everywhere(rt: Runtime) -> None:
    spec = queue_spec(ACT, max_retries=1, fail_handler=FAIL_RECORD, fail_options=FAST, **FAST)
    sup = rt.start({"q": spec})
    q = rt.queue("q")
    q.dispatch({"tag": "x", "raise": "retriable", "message": "boom"}, id="x")
    (fail,) = rt.wait_records(1, "fail")
    retried, failed = rt.wait_events("q", 2)

    # the events: the error's message, the end of the traceback, the dispatch time
    for event in (retried, failed):
        assert event["error_name"] == "ValueError" and event["error_message"] == "boom"
        assert event["traceback"].endswith("ValueError: boom\n")
        assert "in misbehave" in event["traceback"]
        assert ms(event["enqueued_at"]) <= ms(event["started_at"]) <= ms(event["ended_at"])
    assert retried["enqueued_at"] == failed["enqueued_at"]  # one dispatch
    # the fail handler's error: message and traceback besides name and kind
    error = fail["given"][2]
    assert (error["name"], error["message"], error["kind"]) == ("ValueError", "boom", "retriable")
    assert error["traceback"].startswith("Traceback (most recent call last):\n")
    assert error["traceback"].endswith("ValueError: boom\n")
    # the job's record after the end
    job = q.get_job("x")
    assert isinstance(job, JobInfo) and job.state == "failed"
    assert (job.attempts, job.retry_count) == (2, 1)
    assert job.last_error is not None and job.last_error["message"] == "boom"
    assert job.last_error["traceback"] == error["traceback"]
    assert job.worker_pid == int(failed["pid"]) and job.client == failed["client"]
    assert job.host == socket.gethostname() and sup.client_of(failed)
    assert job.enqueued_at is not None and job.started_at is not None
    assert job.ended_at is not None and job.enqueued_at <= job.started_at <= job.ended_at
    # the log: one WARNING line for the retry (its traceback at DEBUG), one ERROR line with
    # the traceback for the failure for good
    in_log(sup, r"WARNING job x of q failed \(attempt 1\), retry 1 of 1 in \S+s: ValueError: boom$")
    in_log(
        sup, r"DEBUG traceback of job x of q \(attempt 1\):\nTraceback \(most recent call last\)"
    )
    found = in_log(
        sup,
        r"ERROR job x of q failed for good \(attempt 2, kind retriable\): ValueError: boom\n"
        r"Traceback \(most recent call last\):\n(.*\n)*?ValueError: boom$",
    )
    assert "in misbehave" in found.group(0)
    assert len(re.findall(r"WARNING job x of q failed", sup.log())) == 1  # one line per retry


def test_the_last_error_shows_while_a_job_waits_for_its_retry(rt: Runtime) -> None:
    rt.start({"q": queue_spec(ACT, min_backoff=30.0, max_backoff=60.0)})
    q = rt.queue("q")
    q.dispatch({"tag": "w", "raise": "retriable", "message": "not yet"}, id="w")
    (retried,) = rt.wait_events("q", 1)
    job = q.get_job("w")
    assert job is not None and job.state == "delayed" and job.retry_count == 1
    assert job.attempts == 1 and job.run_at >= time.time() + 20
    assert job.last_error is not None
    assert (job.last_error["name"], job.last_error["message"]) == ("ValueError", "not yet")
    assert job.last_error["traceback"] == retried["traceback"]  # under 1 KiB: kept whole
    assert job.last_error["at"] == ms(retried["ended_at"])


def test_get_job_tells_each_end_apart(rt: Runtime) -> None:
    sup = rt.start({"q": queue_spec(ACT)})
    q = rt.queue("q")
    q.dispatch({"tag": "ok"}, id="ok")
    q.dispatch({"tag": "bad", "raise": "permanent", "message": "no"}, id="bad")
    q.dispatch({"tag": "later"}, id="later", delay=3600)
    assert q.get_job("later").state == "delayed"  # type: ignore[union-attr]
    assert q.cancel("later")
    rt.wait_events("q", 3)
    ok, bad, later = (q.get_job(i) for i in ("ok", "bad", "later"))
    assert (ok.state, bad.state, later.state) == ("finished", "failed", "cancelled")  # type: ignore[union-attr]
    assert ok.worker_pid in sup.workers() and ok.last_error is None  # type: ignore[union-attr]
    assert bad.last_error["name"] == "PermanentError"  # type: ignore[union-attr, index]
    assert later.worker_pid is None and later.started_at is None  # type: ignore[union-attr]
    assert q.get_job("never") is None


@ON_CLUSTER
def test_a_timed_out_job_is_logged_until_its_final_timeout_error(rt: Runtime) -> None:
    sup = rt.start({"q": queue_spec(ACT, timeout=0.5, max_timeouts=1, **FAST)})
    rt.queue("q").dispatch({"tag": "s", "spin": True}, id="s")
    timed_out, failed = rt.wait_events("q", 2, timeout=20.0)
    assert (timed_out["outcome"], failed["outcome"]) == ("timed_out", "failed")
    assert timed_out["error_message"].startswith("job passed its timeout of 0.5s on worker")
    in_log(
        sup,
        r"WARNING job s of q timed out \(attempt 1\), retried in \S+s: TimeoutError: job "
        r"passed its timeout of 0\.5s on worker \d+$",
    )
    in_log(
        sup,
        r"ERROR job s of q failed for good \(attempt 2, kind stall\): TimeoutError: job "
        r"timed out 1 times \(max_timeouts=1\)$",
    )
    job = rt.queue("q").get_job("s")
    assert job is not None and job.state == "failed"
    assert job.last_error is not None and job.last_error["name"] == "TimeoutError"


def test_a_job_a_shutdown_hands_back_is_logged(rt: Runtime) -> None:
    sup = rt.start({"q": queue_spec(ACT)}, shutdown_timeout=0.3)
    rt.queue("q").dispatch({"tag": "g", "gate": "never"}, id="g")
    rt.wait_records(1, "start", tag="g")
    assert sup.stop() == 0
    assert re.search(
        r"WARNING job g of q handed back to waiting, not counted: the supervisor shut down "
        r"before it ended$",
        sup.log(),
        re.MULTILINE,
    )
    (released,) = rt.events("q")
    assert released["outcome"] == "released"
    assert rt.queue("q").get_job("g").state == "waiting"  # type: ignore[union-attr]


# ---------------------------------------------------------------- results


class Counting:
    """A producer client whose queue counts its get_job calls (what result() looks at)."""

    def __init__(self, rt: Runtime) -> None:
        self.client = Client(rt.url, workers=0, prefix=rt.prefix)
        self.queue = self.client.queue("r")
        self.looks = 0
        looked = self.queue.get_job

        def get_job(job_id: str) -> JobInfo | None:
            self.looks += 1
            return looked(job_id)

        self.queue.get_job = get_job  # type: ignore[method-assign]


@ON_CLUSTER
def test_a_result_round_trips_and_wakes_its_waiter_at_once(rt: Runtime) -> None:
    rt.start({"r": queue_spec(RETURNS, store_results=True)})
    value = {"sum": 3, "items": [1, "two", None, 2.5]}
    rt.queue("r").dispatch({"tag": "r", "gate": "r", "value": value}, id="r")
    rt.wait_records(1, "start", tag="r")
    waiter = Counting(rt)
    got: dict[str, Any] = {}

    def wait() -> None:
        got["value"] = waiter.queue.result("r", timeout=30.0)
        got["at"] = time.time()

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for(lambda: waiter.looks >= 1, what="the waiter's first look")
    time.sleep(1.0)  # a window in which a poller would look again and again
    looks = waiter.looks
    rt.open_gate("r")
    thread.join(timeout=30)
    waiter.client.close()
    (finished,) = rt.wait_events("r", 1)
    assert got["value"] == value and rt.queue("r").get_job("r").result == value  # type: ignore[union-attr]
    delay = got["at"] - ms(finished["ended_at"])
    assert delay < 1.0, f"the waiter woke {delay:.3f}s after the finish"
    assert looks <= 2 and waiter.looks <= looks + 1, "result() polled the job"


def test_result_raises_for_a_failure_an_unknown_id_and_its_timeout(rt: Runtime) -> None:
    rt.start({"r": queue_spec(RETURNS, store_results=True)})
    q = rt.queue("r")
    q.dispatch({"tag": "p", "raise": "permanent", "message": "nope"}, id="p")
    with pytest.raises(JobFailed, match="job p of r failed: PermanentError: nope") as caught:
        q.result("p", timeout=15.0)
    assert caught.value.error["traceback"].endswith("PermanentError: nope\n")
    assert caught.value.job.state == "failed"
    with pytest.raises(JobNotFound, match="no job 'ghost' in queue 'r'"):
        q.result("ghost")
    q.dispatch({"tag": "g", "gate": "g"}, id="g")
    started = time.monotonic()
    with pytest.raises(ResultTimeout, match="did not end within 0.3s"):
        q.result("g", timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 3.0
    q.dispatch({}, id="c", delay=3600)
    threading.Timer(0.2, q.cancel, ["c"]).start()
    with pytest.raises(JobFailed, match="cancelled") as caught:
        q.result("c", timeout=15.0)
    assert caught.value.error["kind"] == "cancelled"


def test_the_async_result_is_woken_by_the_end(rt: Runtime) -> None:
    rt.start({"r": queue_spec(RETURNS, store_results=True)})
    rt.queue("r").dispatch({"tag": "a", "gate": "a", "value": [1, 2]}, id="a")
    rt.wait_records(1, "start", tag="a")

    async def main() -> Any:
        async with AsyncClient(rt.url, prefix=rt.prefix) as client:
            waiting = asyncio.ensure_future(client.queue("r").result("a", timeout=30.0))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            rt.open_gate("a")
            return await waiting

    assert asyncio.run(main()) == [1, 2]


@pytest.mark.parametrize(
    "bad, says",
    [("set", "is a set"), ("nan", "is nan"), ("key", "non-str key"), ("object", "is a object")],
)
def test_a_result_that_is_not_json_fails_that_job_alone(rt: Runtime, bad: str, says: str) -> None:
    sup = rt.start({"r": queue_spec(RETURNS, store_results=True)})
    q = rt.queue("r")
    q.dispatch({"tag": "bad", "bad": bad}, id="bad")
    q.dispatch({"tag": "good", "value": "fine"}, id="good")
    events = {e["id"]: e for e in rt.wait_events("r", 2)}
    failed = events["bad"]
    assert (failed["outcome"], failed["error_name"], failed["error_kind"]) == (
        "failed",
        "InvalidResult",
        "permanent",
    )
    assert says in failed["error_message"] and "the handler of r job bad" in failed["error_message"]
    assert events["good"]["outcome"] == "finished" and q.result("good") == "fine"
    assert failed["pid"] == events["good"]["pid"]  # the same worker: it did not crash
    assert len(sup.workers()) == 1 and int(failed["pid"]) in sup.workers()


# ---------------------------------------------------------------- retention


def test_the_retention_keeps_the_servers_memory_flat(rt: Runtime, r: redis.Redis) -> None:
    """Ten times the kept count of jobs, each with 2 KB of data, dispatched and finished:
    the records stay at the count and used_memory does not grow with the jobs (without the
    retention it grows by about 1 MB per round)."""
    keep = {"count": 50, "seconds": 3600.0}
    rt.start({"q": queue_spec(QUIET, keep_finished=keep, events_maxlen=10)}, workers=1)
    q = rt.queue("q")
    keys = QueueKeys(rt.prefix, "q", "q")
    pad = "x" * 2000
    used = []
    for done in range(500, 3000, 500):
        q.dispatch_many({"data": {"pad": pad, "n": n}} for n in range(500))
        wait_for(lambda done=done: q.counts()["finished"] == done, timeout=60.0)
        assert r.zcard(f"{keys.base}:finished") == r.hlen(f"{keys.base}:ends") == 50
        used.append(int(r.info("memory")["used_memory"]))
    growth = used[-1] - used[1]  # rounds 2-5: 2000 jobs, 4 MB of data
    assert growth < 500_000, f"used_memory grew by {growth} bytes: {used}"


# ---------------------------------------------------------------- supervisors and queues


def test_live_supervisors_and_the_queues_are_listed(rt: Runtime) -> None:
    sup = rt.start({"a": queue_spec(ACT, size=20), "b": queue_spec(ACT)}, workers=1)
    rt.queue("a").dispatch({"tag": "g", "gate": "g"}, id="g")
    rt.queue("c").dispatch({}, id="only-dispatched")
    rt.wait_records(1, "start", tag="g")
    client = rt.queue("a").client

    def listed() -> dict[str, Any] | None:
        entries = client.supervisors()
        return entries[0] if entries and entries[0]["jobs"] else None

    entry = wait_for(listed, what="the supervisor's entry with its job")
    assert (entry["host"], entry["pid"], entry["queues"]) == (
        socket.gethostname(),
        sup.pid,
        ["a", "b"],
    )
    assert set(entry["workers"]) == sup.workers() and entry["units"] == 100
    assert entry["free_units"] == 80 and entry["stopping"] is False
    (job,) = entry["jobs"]
    assert (job["queue"], job["id"], job["worker_pid"]) == ("a", "g", entry["workers"][0])
    assert abs(job["started_at"] - time.time()) < 30 and entry["started_at"] <= job["started_at"]
    assert entry["beat_at"] <= entry["expires_at"] and sup.client_of({"client": entry["id"]})
    assert {"a", "b", "c"} <= set(client.queues())
    rt.open_gate("g")
    assert sup.stop() == 0
    assert client.supervisors() == []  # it took itself off when it stopped
    sup2 = rt.start({"a": queue_spec(ACT)}, workers=1)
    wait_for(lambda: client.supervisors(), what="the second supervisor")
    sup2.signal_all(signal.SIGKILL)  # gone without a word: not listed past its expiry
    wait_for(lambda: client.supervisors() == [], timeout=10.0, what="its entry to expire")
