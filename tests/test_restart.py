"""Crash and restart tests (issue 4 §2), as real processes against real servers.

- Redis restarted under load with AOF on (`appendfsync everysec`): the supervisor logs the
  outage, reconnects without a restart, and no job is lost; a restart that lost the writes
  of the last second (a machine crash) loses none of the jobs dispatched before them either.
- Redis unreachable when `queasy run` starts: a retry line per attempt, then it works.
- A supervisor SIGKILLed mid-batch: its workers exit on their own; its jobs come back after
  its expiry with stall_count + 1 and another supervisor runs them.

The fourth scenario of §2, a whole supervisor process group frozen (SIGSTOP) past its expiry
and resumed, is `test_a_frozen_supervisor_is_swept_and_on_waking_kills_its_workers` in
tests/test_runtime_faults.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from lua_calls import live
from runtime_helpers import ROOT, Runtime, queue_spec, wait_for

from queasy_py import Client
from queasy_py.store.embedded import EmbeddedServer, free_port

#: the `queasy` console script of this environment
QUEASY = str(Path(sys.executable).with_name("queasy"))
AOF = ("--appendonly", "yes", "--appendfsync", "everysec")


class AofServer:
    """An embedded server with AOF on, on a fixed port and data dir, that a test can crash."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.data_dir = data_dir
        self.server = EmbeddedServer(port=self.port, data_dir=data_dir, extra_args=AOF).start()

    @property
    def url(self) -> str:
        return self.server.url

    def crash(self) -> None:
        """SIGKILL the server process (what the kernel wrote of its AOF survives)."""
        assert self.server.pid is not None
        os.kill(self.server.pid, signal.SIGKILL)
        self.server.stop()  # reaps it; the data dir is ours, so it is kept

    def restart(self) -> None:
        self.server = EmbeddedServer(port=self.port, data_dir=self.data_dir, extra_args=AOF)
        self.server.start()

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def aof(tmp_path: Path) -> Iterator[AofServer]:
    server = AofServer(tmp_path / "redis")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def aof_rt(aof: AofServer, tmp_path: Path) -> Iterator[Runtime]:
    r = redis.Redis.from_url(aof.url, decode_responses=True)
    try:
        with Runtime(aof.url, "qt-restart", r, tmp_path) as runtime:
            yield runtime
    finally:
        r.close()


@pytest.fixture
def rt(redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(redis_url, prefix, r, tmp_path) as runtime:
        yield runtime


def finished(rt: Runtime, queue: str = "q") -> Counter[str]:
    """Finished events per job id."""
    return Counter(e["id"] for e in rt.events(queue) if e["outcome"] == "finished")


def all_finished(rt: Runtime, ids: list[str], timeout: float) -> None:
    wait_for(
        lambda: set(ids) <= set(finished(rt)),
        timeout,
        f"all {len(ids)} jobs to finish",
    )


def idle_counts() -> dict[str, int]:
    return {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}


# ---------------------------------------------------------------- Redis restarted under load


def test_redis_killed_under_load_and_restarted_loses_no_job(
    aof: AofServer, aof_rt: Runtime
) -> None:
    rt = aof_rt
    ids = rt.queue("q").dispatch_many({"data": {"tag": f"j{i}", "sleep": 0.1}} for i in range(120))
    dispatched = time.monotonic()
    sup = rt.start({"q": queue_spec(size=25, timeout=30.0)}, workers=2)

    # mid-run, and more than a second after the last dispatch: its fsync has happened
    wait_for(lambda: len(finished(rt)) >= 20, what="20 jobs to finish")
    wait_for(lambda: time.monotonic() - dispatched > 1.5, what="the everysec fsync")
    assert len(finished(rt)) < len(ids), "the load ended before the crash: use more jobs"
    aof.crash()
    crashed = time.time()

    wait_for(lambda: "Redis unreachable" in sup.log(), what="the supervisor to log the outage")
    wait_for(lambda: "heartbeat failed" in sup.log(), what="the heartbeat to log the outage")
    # while it waits for the server, the supervisor backs off: it does not spin the CPU
    cpu = psutil.Process(sup.pid)
    before, t0 = sum(cpu.cpu_times()[:2]), time.monotonic()
    time.sleep(1.0)  # a measurement window, not a wait for an event
    busy = (sum(cpu.cpu_times()[:2]) - before) / (time.monotonic() - t0)
    assert busy < 0.3, f"the supervisor used {busy:.0%} of a CPU while Redis was down"
    aof.restart()
    restarted = time.time()

    later = rt.queue("q").dispatch_many({"data": {"tag": f"later{i}"}} for i in range(5))
    all_finished(rt, ids + later, timeout=60.0)
    assert sup.proc.poll() is None  # the same supervisor process, never restarted
    counts = finished(rt)
    assert all(counts[i] == 1 for i in ids + later), "a job finished twice"
    events = rt.events("q")
    assert all(sup.client_of(e) for e in events)
    assert any(int(e["ended_at"]) >= restarted * 1000 for e in events if e["id"] in ids)
    # a job whose handler ran to its end before the crash is not run again: its ack was kept
    for job_id in ids:
        runs = rt.records(id=job_id)
        ended = [i for i, rec in enumerate(runs) if rec["event"] == "end"]
        assert ended and not [rec for rec in runs[ended[0] + 1 :] if rec["event"] == "start"], (
            job_id,
            runs,
        )
    assert live(rt.queue("q").counts()) == idle_counts()
    log = sup.log()
    assert log.count("Redis unreachable") >= 1
    # threads kept going (the handlers' own tracebacks, of jobs that failed while Redis was
    # down, are quoted in the log on purpose: only a traceback of queasy itself would count)
    assert "Exception in thread" not in log
    assert "Traceback" not in sup.log_without_job_tracebacks()
    assert crashed < restarted
    assert sup.stop() == 0


def test_a_restart_that_lost_the_last_writes_loses_no_earlier_job(
    aof: AofServer, aof_rt: Runtime, tmp_path: Path
) -> None:
    """A machine crash with `appendfsync everysec` loses up to about a second of writes.

    Simulated by restoring a copy of the AOF taken a moment before the crash: job a was
    running then and finished after the copy; job b was dequeued after it. On restart, a is
    active again, leased to a supervisor that believes it finished, and b is waiting again
    while the supervisor still runs it. Both must run to the end again (at least once).
    """
    rt = aof_rt
    q = rt.queue("q")
    q.dispatch({"tag": "a", "sleep": 1.0}, id="a")
    q.dispatch({"tag": "b", "sleep": 3.0}, id="b")
    sup = rt.start({"q": queue_spec(size=100, timeout=30.0)}, workers=1)
    rt.wait_records(1, "start", tag="a")
    snapshot = tmp_path / "aof-at-a-start"
    shutil.copytree(aof.data_dir / "appendonlydir", snapshot)

    rt.wait_records(1, "start", tag="b")  # a has finished, and its finish was acked
    assert finished(rt) == {"a": 1}
    aof.crash()
    shutil.rmtree(aof.data_dir / "appendonlydir")
    shutil.copytree(snapshot, aof.data_dir / "appendonlydir")
    wait_for(lambda: "heartbeat failed" in sup.log(), what="the heartbeat to log the outage")
    aof.restart()
    assert finished(rt) == {}  # the lost writes: a's finish and b's dequeue

    all_finished(rt, ["a", "b"], timeout=30.0)
    assert sup.proc.poll() is None
    assert live(q.counts()) == idle_counts()
    assert q.get_job("a").state == q.get_job("b").state == "finished"  # type: ignore[union-attr]
    assert sup.stop() == 0


# ---------------------------------------------------------------- Redis unreachable at start


def test_queasy_run_retries_an_unreachable_redis_then_works(tmp_path: Path) -> None:
    port = free_port()
    password = "qt-late-pw"  # the embedded server requires one; given, so the URL is known
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    masked = f"redis://:***@127.0.0.1:{port}/0"  # what the log shows
    prefix = "qt-late"
    config = tmp_path / "queasy.toml"
    config.write_text(
        f'redis = "{url}"\nprefix = "{prefix}"\nworkers = 1\nheartbeat_interval = 0.5\n'
        '[queues.q]\nhandler = "tests.runtime_handlers.act"\n'
    )
    log_path = tmp_path / "run.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "QUEASY_TEST_URL": url,
        "QUEASY_TEST_PREFIX": prefix,
    }
    server: EmbeddedServer | None = None
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [QUEASY, "run", str(config)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        retry_line = f"cannot connect to Redis at {masked}: "
        wait_for(lambda: retry_line in log_path.read_text(), what="a retry line")
        assert "; retrying in 1s (try 1)" in log_path.read_text()
        assert "attempt 1 of" not in log_path.read_text()  # one line per try, not nested ones
        assert proc.poll() is None
        server = EmbeddedServer(port=port, password=password).start()
        r = redis.Redis.from_url(url, decode_responses=True)
        with Client(url, workers=0, prefix=prefix) as producer:
            producer.queue("q").dispatch({"tag": "late"}, id="late")
            rt = Runtime(url, prefix, r, tmp_path)
            (event,) = rt.wait_events("q", 1, timeout=30.0)
            assert (event["id"], event["outcome"]) == ("late", "finished")
        r.close()
        assert f"queasy run: {config} on {masked}" in log_path.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        print(log_path.read_text(errors="replace"))
        if server is not None:
            server.stop()


# ---------------------------------------------------------------- supervisor SIGKILLed


def test_a_supervisor_killed_mid_batch_its_workers_exit_and_its_jobs_run_elsewhere(
    rt: Runtime,
) -> None:
    q = rt.queue("q")
    # 8 jobs fill both workers (4 x 25 units each) and block on a gate the first time;
    # 4 more wait for capacity
    held = q.dispatch_many(
        {"data": {"tag": "held", "gate": "never", "times": 1}, "id": f"h{i}"} for i in range(8)
    )
    waiting = q.dispatch_many({"data": {"tag": "waiting"}, "id": f"w{i}"} for i in range(4))
    doomed = rt.start({"q": queue_spec(size=25)}, workers=2)
    starts = rt.wait_records(8, "start", tag="held")
    workers = doomed.workers()
    assert {s["pid"] for s in starts} == workers and len(workers) == 2

    doomed.signal(signal.SIGKILL)  # the supervisor only, not its process group
    killed = time.monotonic()

    def orphans() -> list[int]:
        out = []
        for pid in workers:
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE and "queasy_py.runtime.worker" in " ".join(
                    proc.cmdline()
                ):
                    out.append(pid)
            except psutil.NoSuchProcess:
                pass
        return out

    wait_for(lambda: not orphans(), timeout=1.0, what="the orphaned workers to exit")
    assert time.monotonic() - killed < 1.0
    assert doomed.wait(timeout=5) == -signal.SIGKILL

    heir = rt.start({"q": queue_spec(size=25)}, workers=2, poll_interval=0.2)
    ends = rt.wait_records(12, "end", timeout=20.0)
    by_id = {e["id"]: e for e in ends}
    assert sorted(by_id) == sorted(held + waiting)
    assert {by_id[i]["stall_count"] for i in held} == {1}
    assert {by_id[i]["stall_count"] for i in waiting} == {0}
    assert {e["pid"] for e in ends} <= heir.workers()

    events = rt.wait_events("q", 20)
    stalled = [e for e in events if e["outcome"] == "stalled"]
    assert sorted(e["id"] for e in stalled) == sorted(held)
    assert all(doomed.client_of(e) and e["stall_count"] == "1" for e in stalled)
    done = [e for e in events if e["outcome"] == "finished"]
    assert sorted(e["id"] for e in done) == sorted(held + waiting)
    assert all(heir.client_of(e) for e in done)
    # the first runs of the held jobs never ended: their workers died with the supervisor
    assert len(rt.records("start", tag="held")) == 16
    assert len(rt.records("end", tag="held")) == 8
    assert heir.stop() == 0
