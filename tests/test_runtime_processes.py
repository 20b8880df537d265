"""A worker's processes (issue #19): each worker leads a session of its own, so a timeout kill,
a worker's death and the supervisor's exit (a signal, Ctrl-C, SIGKILL) take every process its
jobs started, in the background too; workers import what the supervisor would (the same
sys.path, zip entries included, the working directory last).
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
import zipfile
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


#: prctl(2) option: orphaned descendants are reparented to this process, not to init
PR_SET_CHILD_SUBREAPER = 36


@pytest.fixture
def late_reaper() -> Iterator[list[int]]:
    """This test process as the child subreaper of its descendants, which reaps the orphans
    it adopts only once the test ends (the pids the test puts in the list): a job's killed
    process stays a zombie meanwhile, as under a container init or a process manager that
    reaps late."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    assert prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0, os.strerror(ctypes.get_errno())
    adopted: list[int] = []
    try:
        yield adopted
    finally:
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for pid in adopted:
            try:
                os.kill(pid, signal.SIGKILL)
                wait_for(lambda p=pid: os.waitpid(p, os.WNOHANG)[0], timeout=5.0)
            except ChildProcessError:
                pass  # not adopted here (reaped by its parent)
            except ProcessLookupError:
                pass


def test_a_timeout_kill_does_not_block_the_loop_on_the_killed_processes(
    rt: Runtime, late_reaper: list[int]
) -> None:
    """The loop killed a timed-out worker and then waited for it and every process of its
    tree to be gone (up to 5 s for each). A process of the job that is killed but not yet
    reaped (a zombie whose reaper is late; a process in D state, stuck on a hung NFS read,
    that SIGKILL ends only later) held the whole loop that long: no other worker's result
    was read, no job started. The kill only signals now; the worker is reaped when its exit
    sentinel says so. Here the job's child is adopted, once killed, by this test process,
    which reaps it only at the end: meanwhile the other queue's jobs go on starting."""
    rt.start(
        {
            "slow": queue_spec(SPAWN, timeout=1.0, max_timeouts=1, size=100, priority=1),
            "quick": queue_spec(size=100),
        },
        workers=2,
    )
    rt.queue("slow").dispatch({"tag": "s", "setsid": True, "spin": True}, id="s")
    worker, pids = spawned(rt, "s")
    late_reaper.extend(pids)
    quick = rt.queue("quick").dispatch_many(
        {"data": {"tag": "q", "sleep": 0.05}} for _ in range(60)
    )
    wait_for(lambda: not alive(worker), what="the worker to be killed at the timeout")
    killed = time.time()
    starts = sorted(rec["t"] for rec in rt.wait_records(len(quick), "start", tag="q", timeout=30.0))
    assert starts[0] < killed < starts[-1]  # the kill came while the quick jobs ran
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert max(gaps) < 1.0, gaps
    assert rt.wait_events("slow", 1)[0]["outcome"] == "timed_out"


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


def test_a_worker_ignores_sigterm_but_the_processes_its_jobs_start_do_not(rt: Runtime) -> None:
    rt.start({"q": queue_spec(SPAWN)}, workers=1)
    rt.queue("q").dispatch({"tag": "s", "setsid": True, "gate": "s"}, id="s")
    worker, pids = spawned(rt, "s")
    for pid in (worker, *pids):
        os.kill(pid, signal.SIGTERM)
    all_gone(pids, "the job's processes to die of SIGTERM (no SIG_IGN inherited)")
    assert alive(worker)
    rt.open_gate("s")
    (end,) = rt.wait_records(1, "end", tag="s")
    assert end["pid"] == worker  # the job ran on, on the same worker


# ---------------------------------------------------------------- sys.path


PLANTED = """
import os
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "imported"), "a") as f:
    f.write(f"{os.getpid()}\\n")
raise ImportError("the planted orjson.py was imported")
"""

CWD_HANDLER = """
from tests.runtime_handlers import record

def handle(data, job):
    record("end", data, job, where="cwd")
"""

ZIPPED_HANDLER = """
from tests.runtime_handlers import record

def handle(data, job):
    record("end", data, job, where=__file__)
"""


def test_a_module_planted_in_the_working_directory_never_shadows_an_installed_one(
    rt: Runtime, tmp_path: Path
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "orjson.py").write_text(PLANTED)
    (cwd / "cwd_handler.py").write_text(CWD_HANDLER)
    # the supervisor has the working directory on its sys.path (first, as `python -m` puts
    # it, once it has imported orjson): its workers have it too, but last
    sup = rt.start({"q": queue_spec("cwd_handler")}, cwd=cwd, sys_path=[""])
    rt.queue("q").dispatch({"tag": "c"}, id="c")
    (end,) = rt.wait_records(1, "end", tag="c")
    assert end["where"] == "cwd" and end["pid"] in sup.workers()
    assert not (cwd / "imported").exists()


def test_a_script_supervisor_without_the_working_directory_gives_workers_none(
    rt: Runtime, tmp_path: Path
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "orjson.py").write_text(PLANTED)
    rt.start({"q": queue_spec()}, cwd=cwd)
    rt.queue("q").dispatch({"tag": "a"}, id="a")
    rt.wait_records(1, "end", tag="a")
    assert not (cwd / "imported").exists()


def test_a_handler_in_a_zip_on_the_supervisors_sys_path_runs(rt: Runtime, tmp_path: Path) -> None:
    archive = tmp_path / "handlers.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("zipped_handler.py", ZIPPED_HANDLER)
    rt.start({"q": queue_spec("zipped_handler")}, sys_path=[str(archive)])
    rt.queue("q").dispatch({"tag": "z"}, id="z")
    (end,) = rt.wait_records(1, "end", tag="z")
    assert end["where"].startswith(str(archive))
