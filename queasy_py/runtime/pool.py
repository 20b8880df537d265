"""The pool of worker subprocesses: start, send jobs, receive results, kill process trees."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import orjson
import psutil

from .. import defaults
from .frames import Pipe, pack_jobs

log = logging.getLogger("queasy_py")


@dataclass(slots=True)
class Running:
    """A job checked out by this client and sent to a worker."""

    seq: int
    queue: str
    id: str
    token: str
    data: bytes  # raw JSON, as stored
    run_at: int  # ms
    retry_count: int
    stall_count: int
    timeout_count: int
    size: int
    deadline: float  # monotonic
    timed_out: bool = False
    pushed: bool = False  # leased by dispatch to this client's parked slots
    trace: str = ""  # the W3C traceparent of its dispatch (tracing.py), '' none

    def record(self) -> dict[str, Any]:
        """The job as its fail handler sees it (the `job` of [data, job, error])."""
        return {
            "id": self.id,
            "queue": self.queue,
            "run_at": self.run_at / 1000.0,
            "retry_count": self.retry_count,
            "stall_count": self.stall_count,
            "timeout_count": self.timeout_count,
        }


class WorkerPopen(subprocess.Popen):
    """A worker's process. Reaping one that has exited first kills what is left of its
    process group: a job's background processes die with the worker that ran it, however
    it ended (killed, crashed, or stopped after draining)."""

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:  # exited but not reaped: its pid is still its group's id, never another's
                exited = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                exited = None
            if exited is not None:
                kill_group(self.pid)
        return super().wait(timeout)


@dataclass(eq=False)
class WorkerProc:
    """One worker subprocess and the jobs it holds."""

    process: WorkerPopen
    pipe: Pipe
    sentinel: int  # a pidfd: readable once the process has exited
    free: int = defaults.WORKER_UNITS
    jobs: dict[int, Running] = field(default_factory=dict)
    ready: bool = False
    healthy: bool = True  # False after a timeout: no new jobs, killed when only those remain
    retiring: bool = False  # recycled: no new jobs, stopped once drained
    stop_sent: bool = False  # told to exit (it had drained)
    done: int = 0
    #: monotonic: when the unanswered ping was sent (0: none); when the next one goes
    ping_sent: float = 0.0
    next_ping: float = 0.0
    #: monotonic: no job of it passes its timeout before (a lower bound: lowered as jobs are
    #: sent, made exact by Workers.check_timeouts once reached)
    next_timeout: float = float("inf")

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def idle_units(self) -> int:
        """Units no running job holds: what an operator calls free. `free` is lower while a
        dequeue planned for this worker is in flight (its units reserved for the jobs it may
        bring), which is the loop's bookkeeping, not capacity in use."""
        return defaults.WORKER_UNITS - sum(job.size for job in self.jobs.values())

    @property
    def accepts(self) -> bool:
        return self.ready and self.healthy and not self.retiring

    def send(self, jobs: list[Running]) -> None:
        """Send a batch; each job's data travels as its own bytes (frames.pack_jobs), so
        data that is not JSON fails that job alone, in the worker."""
        heads = [
            [
                j.seq,
                j.queue,
                j.id,
                j.run_at,
                j.retry_count,
                j.stall_count,
                j.timeout_count,
                j.trace,
                len(j.data),
            ]
            for j in jobs
        ]
        payload = pack_jobs(heads, [j.data for j in jobs])
        for j in jobs:  # their units were reserved when the dequeue was planned
            self.jobs[j.seq] = j
            if j.deadline < self.next_timeout:
                self.next_timeout = j.deadline
        self.pipe.send_frame(payload)

    def take(self, seq: int) -> Running | None:
        job = self.jobs.pop(seq, None)
        if job is not None:
            self.free += job.size
            self.done += 1
        return job

    def rss(self) -> int:
        try:
            return psutil.Process(self.pid).memory_info().rss
        except psutil.Error:
            return 0

    def kill(self) -> None:
        """SIGKILL the worker and every process it started (its group and its tree), and
        wait for them (outside the loop: Early, the supervisor's exit)."""
        kill_tree(self.pid)
        self.close()

    def signal_kill(self) -> None:
        """SIGKILL the worker and every process it started, waiting for none of them (the
        loop: its exit sentinel says when to reap it, `close`), and close its pipe."""
        kill_tree(self.pid, wait=False)
        self.pipe.close()

    def close(self) -> None:
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.error("worker %d did not exit after SIGKILL", self.pid)
        self.pipe.close()
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:  # no process left in it
        pass


def kill_tree(pid: int, wait: bool = True) -> None:
    """SIGKILL worker `pid`: its process group (it leads one: start_worker), which takes the
    background processes its jobs started even once init adopted them, and every process
    still under it, which takes those that moved to a session of their own. With `wait`,
    wait up to 5 s for them to be gone (a zombie whose reaper is late, a process in D state
    counts against it): never in the loop."""
    try:
        parent = psutil.Process(pid)
        procs = parent.children(recursive=True) + [parent]
    except psutil.Error:
        procs = []
    kill_group(pid)
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    if wait:
        psutil.wait_procs(procs, timeout=5)


#: the worker's first lines: its sys.path is the supervisor's (argv[1], JSON), set before
#: anything of queasy_py or a handler is imported (`-P`: no working directory put first)
BOOTSTRAP = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    "from queasy_py.runtime.worker import run; run(sys.argv[2:])"
)


def worker_path() -> list[str]:
    """The supervisor's sys.path (zip entries and import-hook entries included) with the
    working directory ('' or its path), if there, moved to the end: an installed package is
    never shadowed by a file of the same name in the directory the supervisor runs in."""
    cwd = os.getcwd()
    path = [p for p in sys.path if p and os.path.abspath(p) != cwd]
    if len(path) < len(sys.path):
        path.append(cwd)
    return list(dict.fromkeys(path))


def start_worker(
    handlers: dict[str, str], env_extra: dict[str, str], results: frozenset[str] = frozenset()
) -> WorkerProc:
    """Start a worker: a fresh interpreter (never a fork of a threaded parent, and the user's
    __main__ is not re-imported) with a socketpair as its pipe, in a session of its own (its
    process group is what kill_tree kills; the supervisor stops it on every exit path, a
    terminal's Ctrl-C included, and it exits with its group when its pipe closes). The
    return values of the queues in `results` are sent back (they store results)."""
    ours, theirs = socket.socketpair()
    env = dict(os.environ)
    # workers log at the supervisor's level (`queasy --log-level`), format defaults.LOG_FORMAT
    env[defaults.LOG_LEVEL_ENV] = str(logging.getLogger().getEffectiveLevel())
    env.update(env_extra)
    try:
        process = WorkerPopen(
            [
                sys.executable,
                "-P",
                "-c",
                BOOTSTRAP,
                orjson.dumps(worker_path()).decode(),
                str(theirs.fileno()),
                orjson.dumps(handlers).decode(),
                orjson.dumps(sorted(results)).decode(),
            ],
            pass_fds=[theirs.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        theirs.close()
    log.debug("started worker pid %d", process.pid)
    return WorkerProc(process=process, pipe=Pipe(ours), sentinel=os.pidfd_open(process.pid))
