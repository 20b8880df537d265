"""A worker's processes (issue #19): each worker leads a session of its own, so a timeout kill,
a worker's death and the supervisor's exit (a signal, Ctrl-C, SIGKILL) take every process its
jobs started, in the background too.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from runtime_helpers import Runtime, queue_spec, wait_for

SPAWN = "tests.runtime_handlers.spawn"


@pytest.fixture
def rt(redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(redis_url, prefix, r, tmp_path) as runtime:
        yield runtime


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def spawned(rt: Runtime, tag: str) -> tuple[int, list[int]]:
    """The worker pid and the pids of the processes the job started (all alive)."""
    (rec,) = rt.wait_records(1, "spawned", tag=tag)
    pids = [rec["background"], rec["session"]]
    assert all(alive(pid) for pid in pids)
    assert os.getsid(rec["session"]) == rec["session"]  # a session of its own
    return rec["pid"], pids


def all_gone(pids: list[int], what: str) -> None:
    wait_for(lambda: not any(alive(pid) for pid in pids), timeout=5.0, what=what)


def test_a_worker_leads_its_own_session_and_process_group(rt: Runtime) -> None:
    sup = rt.start({"q": queue_spec()}, workers=1)
    (worker,) = wait_for(sup.workers, what="a worker")
    assert os.getsid(worker) == os.getpgid(worker) == worker != os.getpgid(sup.pid)


def test_a_timeout_kill_takes_every_process_the_job_started(rt: Runtime) -> None:
    rt.start({"q": queue_spec(SPAWN, timeout=1.0, max_timeouts=1)}, workers=1)
    rt.queue("q").dispatch({"tag": "s", "setsid": True, "spin": True}, id="s")
    worker, pids = spawned(rt, "s")
    wait_for(lambda: not alive(worker), what="the worker to be killed at the timeout")
    all_gone(pids, "the job's background processes to die with its worker")
    assert rt.wait_events("q", 1)[0]["outcome"] == "timed_out"


def test_a_worker_that_dies_takes_the_processes_its_jobs_started(rt: Runtime) -> None:
    """Its process group goes (a child that left the group, once init adopted it, is out of
    reach: only a kill while it is still under the worker takes that one)."""
    rt.start({"q": queue_spec(SPAWN)}, workers=1)
    rt.queue("q").dispatch({"tag": "s", "setsid": True, "gate": "s", "times": 1}, id="s")
    worker, pids = spawned(rt, "s")
    os.kill(worker, signal.SIGKILL)
    rt.wait_records(1, "end", tag="s")  # retried on the new worker
    all_gone([pids[0]], "the background process of the dead worker's job")
    os.kill(pids[1], signal.SIGKILL)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT to the process group", "SIGKILL"])
def test_the_supervisors_exit_takes_every_process_its_jobs_started(rt: Runtime, how: str) -> None:
    sup = rt.start({"q": queue_spec(SPAWN)}, workers=1, shutdown_timeout=0.5)
    rt.queue("q").dispatch({"tag": "s", "setsid": True, "gate": "never"}, id="s")
    worker, pids = spawned(rt, "s")
    if how == "SIGTERM":
        sup.signal(signal.SIGTERM)
    elif how == "SIGKILL":  # the supervisor alone: its worker sees its pipe close
        sup.signal(signal.SIGKILL)
    else:  # Ctrl-C in a terminal: the worker, in its own session, does not get it
        sup.signal_group(signal.SIGINT)
    sup.wait()
    wait_for(lambda: not alive(worker), timeout=5.0, what="the worker to exit")
    all_gone(pids, "the job's processes to die with the supervisor")
