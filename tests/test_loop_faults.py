"""The scheduling loop under Redis faults, as real processes against a real server of their
own: a server that refuses writes (maxmemory), loses its function library (FUNCTION FLUSH),
or freezes (SIGSTOP); and workers that cannot start. The supervisor stays up, timeouts act
within their bound, no completed job runs again, nothing is lost.

The handlers' records go to the session's server, so they survive what the queue's server
goes through.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import records
import redis
from lua_calls import live
from runtime_helpers import Runtime, queue_spec, wait_for
from test_bad_input_runtime import queasy, valid_config, write_config

from queasy_py import defaults
from queasy_py.cli import exitcodes
from queasy_py.store.embedded import EmbeddedServer


class Own:
    """A server for one test's queues, with a raw connection to it."""

    def __init__(self) -> None:
        self.server = EmbeddedServer(admin_commands=True).start()  # CONFIG SET maxmemory
        self.r = redis.Redis.from_url(self.server.url, decode_responses=True)

    @property
    def url(self) -> str:
        return str(self.server.url)

    def freeze(self) -> None:
        assert self.server.pid is not None
        os.kill(self.server.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.server.pid is not None
        os.kill(self.server.pid, signal.SIGCONT)

    def close(self) -> None:
        self.thaw()
        self.r.close()
        self.server.stop()


@pytest.fixture
def own() -> Iterator[Own]:
    server = Own()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def rt(own: Own, prefix: str, r: redis.Redis, redis_url: str, tmp_path: Path) -> Iterator[Runtime]:
    own_r = redis.Redis.from_url(own.url, decode_responses=True)
    with Runtime(own.url, prefix, own_r, tmp_path, records=(redis_url, r)) as runtime:
        yield runtime
    own_r.close()


def runs_per_job(rt: Runtime) -> Counter:
    return Counter(rec["id"] for rec in rt.records("start"))


def test_a_server_refusing_writes_for_5s_is_an_outage_not_a_crash(rt: Runtime, own: Own) -> None:
    """maxmemory with noeviction refuses every write (dequeue, acks, heartbeats) with OOM
    while jobs run and end: the acks are kept and sent once it accepts again; no job runs
    twice, none is lost, the supervisor stays up and logs the outage once, not per try."""
    q = rt.queue("q")
    ids = q.dispatch_many({"data": {"tag": "w", "sleep": 0.3}} for _ in range(40))
    sup = rt.start({"q": queue_spec(timeout=30.0)}, workers=1)
    rt.wait_records(5, "start")
    own.r.config_set("maxmemory-policy", "noeviction")
    own.r.config_set("maxmemory", 1)
    time.sleep(5.0)  # the fault's length: jobs end and their acks are refused meanwhile
    assert sup.proc.poll() is None, sup.log()
    own.r.config_set("maxmemory", 0)

    rt.wait_records(40, "end", timeout=60)
    events = rt.wait_events("q", 40, timeout=30)
    assert sup.proc.poll() is None, sup.log()
    assert sorted(e["id"] for e in events if e["outcome"] == "finished") == sorted(ids)
    assert set(runs_per_job(rt).values()) == {1}, runs_per_job(rt)
    # a reconcile after the outage must not hand back what already finished
    time.sleep(1.0)
    assert live(q.counts()) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}
    assert set(runs_per_job(rt).values()) == {1}
    assert sup.log().count("retrying with backoff") <= 3, sup.log()


def test_a_clock_stepped_back_after_an_outage_does_not_hold_the_rounds(
    rt: Runtime, own: Own
) -> None:
    """The loop's backoff after an outage was a time on the host's wall clock, kept after
    the outage ended: a clock stepped back an hour afterwards (NTP, a resumed VM) held every
    round for that hour (no ack, no dequeue: a pushed job ran but never finished)."""
    sup = rt.start({"q": queue_spec()}, workers=1, clock_step=-3600.0)
    rt.queue("q").dispatch({"tag": "before"})
    rt.wait_events("q", 1)
    own.r.config_set("maxmemory-policy", "noeviction")
    own.r.config_set("maxmemory", 1)
    wait_for(lambda: "retrying with backoff" in sup.log(), what="the outage")
    own.r.config_set("maxmemory", 0)
    wait_for(lambda: "Redis answers again" in sup.log(), what="the outage's end")
    sup.signal(signal.SIGUSR1)  # the supervisor's clock goes back an hour
    rt.queue("q").dispatch({"tag": "after"})
    rt.wait_records(1, "end", tag="after")
    events = rt.wait_events("q", 2, timeout=10.0)
    assert [e["outcome"] for e in events] == ["finished", "finished"]
    assert sup.proc.poll() is None, sup.log()


def test_a_flushed_function_library_is_loaded_again(rt: Runtime, own: Own) -> None:
    q = rt.queue("q")
    q.dispatch({"tag": "before"})
    sup = rt.start({"q": queue_spec()}, workers=1)
    rt.wait_records(1, "end", tag="before")
    own.r.execute_command("FUNCTION", "FLUSH")
    wait_for(lambda: own.r.execute_command("FUNCTION", "LIST"), what="the library loaded again")
    assert sup.proc.poll() is None, sup.log()
    q.dispatch({"tag": "after"})
    rt.wait_records(1, "end", tag="after")
    assert "the queasy library is gone; loading" in sup.log()


def test_a_frozen_server_does_not_stop_timeouts_or_signals(rt: Runtime, own: Own) -> None:
    """With the server SIGSTOPped, a job past its timeout is killed within its bound
    (timeout + LOOP_REDIS_TIMEOUT + a second), and SIGTERM still stops the supervisor."""
    timeout = 1.5
    rt.queue("q").dispatch({"tag": "spin", "spin": True})
    sup = rt.start({"q": queue_spec(timeout=timeout)}, workers=1)
    (start,) = rt.wait_records(1, "start", tag="spin")
    own.freeze()
    bound = timeout + defaults.LOOP_REDIS_TIMEOUT + 1.0
    wait_for(
        lambda: not psutil.pid_exists(start["pid"]),
        timeout=bound + 5.0,
        what="the timed-out worker killed",
    )
    killed_after = time.time() - start["t"]
    assert killed_after <= bound, (killed_after, sup.log())
    time.sleep(2.0)  # frozen past the heartbeat's expiry
    sup.signal(signal.SIGTERM)
    code = sup.wait(timeout=25.0)
    assert code == 0, sup.log()


def test_workers_that_cannot_start_are_given_up_on_loudly(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    """A handler that imports in the supervisor but not in its workers: `queasy run` backs
    off between starts, logs the import error once, then exits with its HANDLER code - never
    a respawn storm, never waiting forever."""
    config = "workers = 1\n" + valid_config(
        redis_url, prefix, "tests.runtime_handlers.worker_only_broken"
    )
    began = time.monotonic()
    code, out = queasy("--log-level", "DEBUG", "run", write_config(tmp_path, config))
    assert code == exitcodes.HANDLER == 4, out
    assert out.count("could not load its handlers") == 1, out
    assert out.count("workers in a row could not start") == 1, out
    assert out.count("started worker pid") == defaults.WORKER_START_FAILURES, out
    assert time.monotonic() - began < 30.0


def test_a_worker_stuck_in_c_does_not_block_the_loop(rt: Runtime) -> None:
    """A handler holds the GIL (its worker reads nothing) and a job of ~900 KB is sent to
    the same worker: the send must not block the loop, so the first job's timeout is still
    enforced within its bound (old: after the regex ended, 10+ s)."""
    timeout = 1.5
    q = rt.queue("gil")
    q.dispatch({"tag": "stuck", "gil": 15.0})
    sup = rt.start({"gil": queue_spec("tests.runtime_handlers.gil", timeout=timeout)}, workers=1)
    (start,) = rt.wait_records(1, "start", tag="stuck")
    q.dispatch({"tag": "big", "pad": "x" * 900_000})  # goes to the same, stuck worker
    bound = timeout + 1.5
    wait_for(
        lambda: not psutil.pid_exists(start["pid"]),
        timeout=bound + 20.0,
        what="the stuck worker killed",
    )
    killed_after = time.time() - start["t"]
    assert killed_after <= bound, (killed_after, sup.log())
    (big,) = rt.wait_records(1, "end", tag="big", timeout=20)
    assert big["pid"] != start["pid"]
    assert sup.proc.poll() is None


def test_garbage_on_the_wake_and_push_channels_is_dropped(rt: Runtime, own: Own) -> None:
    """Anyone who may PUBLISH can send anything on a queue's wake channel or a supervisor's
    push channel: it is logged (throttled) and dropped; the supervisor keeps serving."""
    q = rt.queue("q")
    q.dispatch({"tag": "first"})
    sup = rt.start({"q": queue_spec()}, workers=1)
    rt.wait_records(1, "end", tag="first")
    base = q.keys.base
    client = wait_for(lambda: own.r.hkeys(f"{base}:parked"), what="parked slots")[0]
    for _ in range(50):
        own.r.spublish(q.keys.wake, "not-a-number")
        own.r.spublish(q.keys.wake, "1e+20")
        own.r.spublish(q.keys.push(client), "id\ntoken\nrun_at\nx\ny\nz\n{}")
    q.dispatch({"tag": "canary"})
    rt.wait_records(1, "end", tag="canary")
    assert sup.proc.poll() is None, sup.log()
    log = sup.log()
    assert log.count("dropped a malformed wake-up") == 1, log
    assert log.count("dropped a malformed job record") == 1, log


def test_a_job_record_with_garbage_counts_runs_with_them_as_0(rt: Runtime, own: Own) -> None:
    """A record edited around the library (raw HSET of a count) never breaks a dequeue, an
    ack or the supervisor: the library reads a count that is not an integer as 0."""
    q = rt.queue("q")
    q.dispatch({"tag": "bad"}, id="bad")
    q.dispatch({"tag": "good"}, id="good")
    records.garble(own.r, q.keys.base, "bad", "retry_count", "x")
    records.garble(own.r, q.keys.base, "bad", "stall_count", "1e+300")
    sup = rt.start({"q": queue_spec()}, workers=1)
    rt.wait_records(1, "end", tag="good")
    (bad,) = rt.wait_records(1, "end", tag="bad")
    assert (bad["retry_count"], bad["stall_count"]) == (0, 0)
    events = rt.wait_events("q", 2)
    assert sorted(e["outcome"] for e in events) == ["finished", "finished"]
    assert sup.proc.poll() is None, sup.log()


def test_a_supervisor_started_while_the_server_refuses_writes_waits(rt: Runtime, own: Own) -> None:
    """Its first heartbeat is refused (OOM): an outage from the start, not an exit."""
    rt.queue("q").dispatch({"tag": "later"})
    own.r.config_set("maxmemory-policy", "noeviction")
    own.r.config_set("maxmemory", 1)
    sup = rt.start({"q": queue_spec()}, workers=1)
    wait_for(lambda: "first heartbeat failed" in sup.log(), what="the refused first beat")
    time.sleep(1.0)
    assert sup.proc.poll() is None, sup.log()
    own.r.config_set("maxmemory", 0)
    rt.wait_records(1, "end", tag="later", timeout=20)
    assert sup.proc.poll() is None, sup.log()
