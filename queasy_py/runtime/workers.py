"""The worker pool and its health: start and replace workers, read their results, and act on
timeouts (mark unhealthy, replace, kill once only timed-out jobs remain), memory (recycle),
job counts (recycle) and exits (requeue what the worker held)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import orjson

from .. import defaults
from . import outcomes
from .events import Events
from .pool import Running, WorkerProc, kill_tree, start_worker
from .scheduler import QueueState, place

log = logging.getLogger("queasy_py")

MEMORY_CHECK_INTERVAL = 5.0


class Workers:
    """The supervisor's worker subprocesses. Acks it decides go to the shared `acks` list."""

    def __init__(
        self,
        events: Events,
        states: Mapping[str, QueueState],
        env: dict[str, str],
        settings: Mapping[str, Any],
        acks: list[outcomes.Ack],
    ) -> None:
        self.events = events
        self.states = states
        self.handlers = {name: state.spec.handler for name, state in states.items()}
        self.env = env
        workers = settings["workers"]
        self.target: int = workers if workers is not None else defaults.default_workers()
        self.max_jobs_per_worker = int(settings["max_jobs_per_worker"])
        self.max_worker_memory = int(settings["max_worker_memory"])
        self.acks = acks
        self.procs: list[WorkerProc] = []
        self.stopping = False
        self.next_memory_check = 0.0

    def __iter__(self):
        return iter(list(self.procs))

    def __contains__(self, proc: object) -> bool:
        return proc in self.procs

    # ------------------------------------------------------------------ processes

    def _spawn(self) -> WorkerProc:
        proc = start_worker(self.handlers, self.env)
        self.procs.append(proc)
        self.events.register(proc.pipe.fileno(), ("conn", proc))
        self.events.register(proc.sentinel, ("exit", proc))
        return proc

    def ensure(self) -> None:
        """Start workers until `target` of them take jobs (not when stopping)."""
        if self.stopping:
            return
        live = sum(1 for w in self.procs if w.healthy and not w.retiring)
        for _ in range(self.target - live):
            self._spawn()

    def _forget(self, proc: WorkerProc) -> None:
        self.events.unregister(proc.pipe.fileno())
        self.events.unregister(proc.sentinel)
        if proc in self.procs:
            self.procs.remove(proc)

    def kill(self, proc: WorkerProc) -> None:
        self._forget(proc)
        proc.kill()

    def kill_all(self) -> None:
        for proc in list(self.procs):
            self.kill(proc)

    def accepting(self) -> list[WorkerProc]:
        return [w for w in self.procs if w.accepts]

    def reserve(self, size: int) -> WorkerProc | None:
        """The accepting worker with the most free units that fits `size`, its units taken."""
        accepting = self.accepting()
        index = place([w.free for w in accepting], size)
        if index is None:
            return None
        accepting[index].free -= size
        return accepting[index]

    def release(self, size: int, procs: list[WorkerProc]) -> None:
        """Give back units reserved for jobs that did not come."""
        for proc in procs:
            if proc in self.procs:
                proc.free += size

    def running(self) -> int:
        return sum(len(w.jobs) for w in self.procs)

    def next_deadline(self) -> float:
        """The monotonic time of the earliest timeout of a running job (inf: none)."""
        return min(
            (j.deadline for w in self.procs for j in w.jobs.values() if not j.timed_out),
            default=float("inf"),
        )

    # ------------------------------------------------------------------ results and exits

    def receive(self, proc: WorkerProc) -> None:
        """Read every message the worker has sent."""
        for frame in proc.pipe.read_frames():
            self._handle_message(proc, orjson.loads(frame))
        if proc.pipe.eof:  # it closed its end: its exit is handled through the sentinel
            self.events.unregister(proc.pipe.fileno())

    def _handle_message(self, proc: WorkerProc, message: Any) -> None:
        if message == "ready":
            proc.ready = True
            return
        if isinstance(message, list) and message and message[0] == "import-error":
            log.error("worker %d could not load its handlers: %s", proc.pid, message[1])
            return
        now = time.time()
        for seq, started, error in message:
            job = proc.take(seq)
            if job is None:
                continue
            state = self.states[job.queue]
            if job.pushed:  # park its slot again: a dequeue goes with the ack
                state.ready_at = 0.0
            if job.timed_out:  # a result that raced its timeout: the timeout wins
                self.acks.append(self.retry_ack(job, "timeout", proc.pid, started))
                continue
            self.acks.append(
                outcomes.on_result(
                    job, state.spec, state.base, state.fail_base, error, proc.pid, started, now
                )
            )
        if self.max_jobs_per_worker and proc.done >= self.max_jobs_per_worker and proc.healthy:
            self._retire(proc, f"ran {proc.done} jobs")

    def _retire(self, proc: WorkerProc, why: str) -> None:
        if not proc.retiring:
            log.info("recycling worker %d (%s)", proc.pid, why)
            proc.retiring = True
            self.ensure()

    def on_exit(self, proc: WorkerProc) -> None:
        """A worker process ended: its unfinished jobs are retried, a new worker replaces it."""
        self.receive(proc)
        self._forget(proc)
        code = proc.process.wait()
        if proc.jobs or not proc.retiring:
            log.error(
                "worker %d exited with code %s holding %d job(s)", proc.pid, code, len(proc.jobs)
            )
        self.requeue_held(proc, "stall", "WorkerDied")
        proc.close()
        self.ensure()

    def retry_ack(
        self,
        job: Running,
        kind: str,
        pid: int,
        started: int | str,
        error_name: str = "TimeoutError",
    ) -> outcomes.Ack:
        """Retry now, counting `kind` ('timeout', 'stall', 'release')."""
        base = self.states[job.queue].base
        return outcomes.retry(job, base, int(time.time() * 1000), kind, pid, started, error_name)

    def requeue_held(self, proc: WorkerProc, kind: str, error_name: str) -> None:
        """Retry every job `proc` held: a timed-out one as a timeout, the others as `kind`."""
        for job in list(proc.jobs.values()):
            if job.timed_out:
                self.acks.append(self.retry_ack(job, "timeout", proc.pid, ""))
            else:
                self.acks.append(self.retry_ack(job, kind, proc.pid, "", error_name))
        proc.jobs.clear()

    # ------------------------------------------------------------------ health

    def check_timeouts(self, now: float) -> None:
        for proc in list(self.procs):
            for job in proc.jobs.values():
                if not job.timed_out and now >= job.deadline:
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
                        self.ensure()
            if not proc.healthy and all(j.timed_out for j in proc.jobs.values()):
                log.warning("killing worker %d (only timed-out jobs left)", proc.pid)
                self.kill(proc)
                self.requeue_held(proc, "timeout", "TimeoutError")
                self.ensure()

    def check_memory(self, now: float) -> None:
        if not self.max_worker_memory or now < self.next_memory_check:
            return
        self.next_memory_check = now + MEMORY_CHECK_INTERVAL
        for proc in list(self.procs):
            rss = proc.rss()
            if proc.healthy and rss > self.max_worker_memory:
                self._retire(proc, f"RSS {rss} bytes > max_worker_memory")

    def stop_drained(self) -> None:
        """Tell each drained retiring worker to exit; its exit is reaped through its sentinel
        (on_exit), so the loop never blocks on it."""
        for proc in self.procs:
            if proc.retiring and not proc.jobs and not proc.stop_sent:
                proc.stop_sent = True
                try:
                    proc.pipe.send_frame(b'"stop"')
                except OSError:
                    kill_tree(proc.pid)

    def hand_back_all(self) -> None:
        """Shutdown: kill every worker and hand back the jobs they still held."""
        for proc in list(self.procs):
            self.kill(proc)
            for job in proc.jobs.values():
                self.acks.append(self.retry_ack(job, "release", proc.pid, "", "Shutdown"))
            proc.jobs.clear()
