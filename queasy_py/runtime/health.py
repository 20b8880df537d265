"""The worker pool's health checks (runtime/workers.py's Workers inherits them): a worker
not ready in time (a hung import) or dead at start (backoff, then give up), jobs past their
timeout (mark the worker unhealthy, replace it, kill it once only timed-out jobs remain), and
memory (recycle)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from .. import defaults
from ..errors import HandlerError

if TYPE_CHECKING:
    from .pool import WorkerProc
    from .workers import Workers

log = logging.getLogger("queasy_py")

MEMORY_CHECK_INTERVAL = 5.0
#: the first and the longest wait before starting a worker again after one died at start
START_BACKOFF = 0.5
MAX_START_BACKOFF = 30.0


class Health:
    def _start_failed(self: Workers, proc: WorkerProc, why: str) -> None:
        """Back off before the next start; after WORKER_START_FAILURES in a row, give up."""
        self.start_failures += 1
        self.replaced["start"] += 1
        delay = min(MAX_START_BACKOFF, START_BACKOFF * 2 ** (self.start_failures - 1))
        self.next_spawn = time.monotonic() + delay
        if self.start_failures >= defaults.WORKER_START_FAILURES:
            self.fatal = HandlerError(  # run() raises it: `queasy run` exits HANDLER
                f"{self.start_failures} workers in a row could not start (the last {why}): "
                f"{self.import_error or 'no import error was reported'}"
            )
        else:
            log.error(
                "worker %d %s (%d in a row); starting another in %.1fs",
                proc.pid,
                why,
                self.start_failures,
                delay,
            )

    def check_starts(self: Workers, now: float) -> None:
        """Kill a worker that is not ready WORKER_START_TIMEOUT after its start (a hung
        import), counting it as a start that failed."""
        for proc, started in list(self.started.items()):
            if now - started > defaults.WORKER_START_TIMEOUT:
                self.kill(proc)
                self._start_failed(
                    proc, f"was not ready after {defaults.WORKER_START_TIMEOUT:.3g}s"
                )
                self.ensure()

    def check_timeouts(self: Workers, now: float) -> None:
        for proc in list(self.procs):
            if now < proc.next_timeout and proc.healthy:
                continue  # no job of it can have passed its timeout yet
            next_timeout = float("inf")
            for job in proc.jobs.values():
                if not job.timed_out and now < job.deadline:
                    next_timeout = min(next_timeout, job.deadline)
                elif not job.timed_out:
                    job.timed_out = True
                    log.warning(
                        "job %s of %s passed its timeout of %.3gs on worker %d",
                        job.id,
                        job.queue,
                        self.states[job.queue].spec.timeout,
                        proc.pid,
                    )
                    if proc.healthy:
                        proc.healthy = False
                        self.replaced["timeout"] += 1
                        self.ensure()
            proc.next_timeout = next_timeout
            if proc.healthy:
                continue
            if all(j.timed_out for j in proc.jobs.values()):
                log.warning("killing worker %d (only timed-out jobs left)", proc.pid)
                self.kill(proc)
                self.requeue_held(proc, "timeout", "TimeoutError")
                self.ensure()
            else:
                self._check_stuck(proc, now)

    def _check_stuck(self: Workers, proc: WorkerProc, now: float) -> None:
        """An unhealthy worker still running jobs that did not time out is pinged (again
        WORKER_PING_TIMEOUT after each answer), answered on its event loop when it has one.
        One that does not answer in time cannot run them either (a timed-out job holds its
        GIL in C code, or its event loop in a coroutine that never yields): it is killed, at
        once rather than when they reach their own timeouts, and they are handed back, not
        counted."""
        wait = defaults.WORKER_PING_TIMEOUT
        if proc.ping_sent and now - proc.ping_sent >= wait:
            log.warning(
                "killing worker %d: it did not answer a ping for %.3gs after a timeout "
                "(a timed-out job holds it); its other jobs are handed back",
                proc.pid,
                wait,
            )
            self.kill(proc)
            why = f"worker {proc.pid} was stuck in a timed-out job beside it"
            self.requeue_held(proc, "release", "WorkerStuck", why)
            self.ensure()
            return
        if not proc.ping_sent and now >= proc.next_ping:
            proc.ping_sent = now
            try:
                proc.pipe.send_frame(b'"ping"')
            except OSError:
                pass  # it died: its exit sentinel requeues what it held
        due = proc.ping_sent + wait if proc.ping_sent else proc.next_ping
        proc.next_timeout = min(proc.next_timeout, due)

    def check_memory(self: Workers, now: float) -> None:
        if not self.max_worker_memory or now < self.next_memory_check:
            return
        self.next_memory_check = now + MEMORY_CHECK_INTERVAL
        for proc in list(self.procs):
            rss = proc.rss()
            if proc.healthy and rss > self.max_worker_memory:
                self._retire(proc, f"RSS {rss} bytes > max_worker_memory", "memory")
