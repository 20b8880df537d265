"""Shutdown of a real supervisor subprocess under signals and Redis faults: the second signal
skips the drain whenever it comes, SIGHUP, and the exit codes. The queues live on a server
of the test's own (it is frozen), the handlers' records on the session's server."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from runtime_helpers import Runtime, queue_spec, wait_for
from test_loop_faults import Own

from queasy_py.runtime.early import sigterm_interrupts, stops_run
from queasy_py.store.keys import QueueKeys


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


def test_a_second_signal_while_pushes_are_stopped_skips_the_drain(rt: Runtime, own: Own) -> None:
    """The first signal stops the pushes first (queasy_unpark, waiting for its marks); with
    the server frozen that takes LOOP_REDIS_TIMEOUT. A second signal meanwhile must still
    skip the wait for running jobs (it was counted as the first: 60 s of drain)."""
    sup = rt.start({"q": queue_spec()}, workers=1, shutdown_timeout=60.0)
    q = rt.queue("q")
    q.dispatch({"tag": "g", "gate": "never"}, id="g")
    rt.wait_records(1, "start", tag="g")
    own.freeze()
    sup.signal(signal.SIGTERM)
    time.sleep(0.5)  # the loop took the first signal and is stopping the pushes
    sup.signal(signal.SIGTERM)
    time.sleep(2.5)  # the unpark gave up (frozen server)
    own.thaw()
    assert sup.wait(timeout=20.0) == 0, sup.log()
    assert "second signal: not waiting for running jobs" in sup.log()
    job = q.get_job("g")
    assert job is not None and job.state == "waiting" and job.stall_count == 0


def test_sighup_shuts_down_gracefully_and_hands_back_the_running_job(rt: Runtime) -> None:
    """A closed terminal or a dropped ssh session (SIGHUP at its default action) ended the
    supervisor at once, without a line: its job stayed active until its expiry, then ran
    again with a stall counted. It is a graceful shutdown, like SIGTERM."""
    sup = rt.start({"q": queue_spec()}, workers=1, shutdown_timeout=0.5)
    q = rt.queue("q")
    q.dispatch({"tag": "g", "gate": "never"}, id="g")
    (start,) = rt.wait_records(1, "start", tag="g")
    sup.signal(signal.SIGHUP)

    assert sup.wait() == 0, sup.log()
    assert "shutting down" in sup.log()
    assert not psutil.pid_exists(start["pid"])
    job = q.get_job("g")
    assert job is not None and job.state == "waiting"
    assert (job.retry_count, job.stall_count, job.timeout_count) == (0, 0, 0)
    assert [e["outcome"] for e in rt.events("q")] == ["released"]


def test_an_ignored_or_handled_sighup_is_left_as_it_is() -> None:
    """`nohup queasy run` must outlive the hangup; an application's own SIGHUP handler (a
    log reopen) stays the application's."""
    previous = signal.getsignal(signal.SIGHUP)
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        assert not stops_run(signal.SIGHUP)
        with sigterm_interrupts():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        signal.signal(signal.SIGHUP, lambda *_: None)
        assert not stops_run(signal.SIGHUP)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        assert stops_run(signal.SIGHUP) and stops_run(signal.SIGTERM)
        with sigterm_interrupts():
            assert stops_run(signal.SIGHUP)
            with pytest.raises(KeyboardInterrupt, match="SIGHUP before the supervisor ran"):
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(1.0)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_outcomes_redis_never_took_before_the_exit_are_named(rt: Runtime, own: Own) -> None:
    """Shutdown waits ACK_DEADLINE (10 s) for its last acks; a server that refuses writes
    all that time (out of memory) made it exit without a word, and the finished job was
    swept back and ran again with nothing saying why. Now one ERROR line names the jobs."""
    sup = rt.start({"q": queue_spec()}, workers=1)
    q = rt.queue("q")
    q.dispatch({"tag": "g", "gate": "late"}, id="late")
    rt.wait_records(1, "start", tag="g")
    own.r.config_set("maxmemory-policy", "noeviction")
    own.r.config_set("maxmemory", 1)  # writes refused: the finish ack cannot land
    sup.signal(signal.SIGTERM)
    rt.open_gate("late")  # it ends during the drain
    rt.wait_records(1, "end", tag="g")
    assert sup.wait(timeout=40.0) == 0, sup.log()
    own.r.config_set("maxmemory", 0)
    errors = [line for line in sup.log().splitlines() if " ERROR " in line]
    assert any("1 outcome(s) not acknowledged" in e and "q/late" in e for e in errors), sup.log()
    job = q.get_job("late")
    assert job is not None and job.state == "active"  # its lease is swept, as the line says


def test_a_dequeue_reply_that_comes_during_the_drain_starts_no_job(rt: Runtime, own: Own) -> None:
    """The shutdown stops asking for jobs, but a dequeue sent just before it was still on its
    way: its reply, read during the drain, started its jobs (the drain is for the jobs that
    run, and these could then be killed at shutdown_timeout). The server is frozen while
    that dequeue is on its way, so its reply comes after the signal; its job goes back to
    waiting, never started, no count."""
    sup = rt.start({"q": queue_spec()}, workers=1, shutdown_timeout=30.0)
    q = rt.queue("q")
    q.dispatch({"tag": "g", "gate": "drain"}, id="g")  # holds the drain open
    rt.wait_records(1, "start", tag="g")
    q.dispatch({"tag": "late"}, id="late", delay=1.0)  # dequeued 1 s from now
    time.sleep(0.5)
    own.freeze()  # the dequeue for `late` is sent into a frozen server
    time.sleep(1.1)
    sup.signal(signal.SIGTERM)
    time.sleep(0.3)
    own.thaw()  # the reply comes (within LOOP_REDIS_TIMEOUT of its send): shutdown began
    time.sleep(1.0)
    rt.open_gate("drain")
    assert sup.wait(timeout=30.0) == 0, sup.log()
    assert rt.records(tag="late") == [], sup.log()
    job = q.get_job("late")
    assert job is not None and job.state == "waiting", job
    # leased once by that dequeue (attempts counts leases), no retry, stall or timeout
    assert (job.attempts, job.retry_count, job.stall_count, job.timeout_count) == (1, 0, 0, 0)


def test_jobs_pushed_while_liveness_is_unknown_are_handed_back_at_shutdown(
    rt: Runtime, own: Own
) -> None:
    """Jobs pushed to a supervisor while it does not know whether it is alive (woken from a
    freeze, its heartbeat not yet answered) are held, not started. A shutdown that came
    first dropped them: they stayed active, leased to the supervisor that had left, until a
    sweep after its expiry put them back with a stall counted. They are handed back at
    shutdown like any job not started: waiting again at once, nothing counted. The server is
    frozen when the supervisor wakes, so its heartbeat cannot answer before the shutdown."""
    sup = rt.start({"q": queue_spec()}, workers=1, poll_interval=30.0)  # no polling dequeue
    base = QueueKeys(rt.prefix, "q", "q").base
    parked = wait_for(lambda: own.r.hgetall(f"{base}:parked"), what="its slots parked")
    (client,) = parked
    fresh = own.r.zscore(f"{base}:fresh", client)
    # a push goes to a client fresh for half its expiry: stop it right after a heartbeat
    wait_for(lambda: own.r.zscore(f"{base}:fresh", client) != fresh, what="a heartbeat")
    sup.signal(signal.SIGSTOP)
    stopped = time.monotonic()
    q = rt.queue("q")
    ids = [q.dispatch({"tag": "pushed"}) for _ in range(2)]
    for job_id in ids:  # leased by the dispatch: pushed to the stopped supervisor
        assert own.r.hget(f"{base}:lease:{client}", job_id) is not None, job_id
    # woken past its expiry (1 s: heartbeat_interval 0.5), its liveness is unknown
    time.sleep(max(0.0, stopped + 1.5 - time.monotonic()))
    own.freeze()
    sup.signal(signal.SIGTERM)
    sup.signal(signal.SIGCONT)
    wait_for(lambda: "could not stop pushes" in sup.log(), what="the unpark to give up")
    own.thaw()
    assert sup.wait(timeout=30.0) == 0, sup.log()
    assert rt.records(tag="pushed") == [], sup.log()
    for job_id in ids:
        job = q.get_job(job_id)
        assert job is not None and job.state == "waiting", (job, sup.log())
        assert (job.retry_count, job.stall_count, job.timeout_count) == (0, 0, 0), job
