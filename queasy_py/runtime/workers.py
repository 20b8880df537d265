"""The worker pool: start and replace workers, read their results, and act on job counts
(recycle) and exits (requeue what the worker held). Its health checks (starts, timeouts,
memory) are in runtime/health.py."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from .. import defaults
from ..errors import HandlerError
from . import outcomes
from .early import Early, start_at_once
from .events import Events
from .health import Health
from .pool import Running, WorkerProc, kill_tree, start_worker
from .scheduler import QueueState, place

if TYPE_CHECKING:
    from .metrics import Tally

log = logging.getLogger("queasy_py")


class Workers(Health):
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
        self.results = frozenset(n for n, state in states.items() if state.spec.store_results)
        self.env = env
        workers = settings["workers"]
        self.target: int = workers if workers is not None else defaults.default_workers()
        self.max_jobs_per_worker = int(settings["max_jobs_per_worker"])
        self.max_worker_memory = int(settings["max_worker_memory"])
        #: workers started at once (each start is an interpreter importing its handlers)
        self.start_at_once = start_at_once()
        self.acks = acks
        self.procs: list[WorkerProc] = []
        self.stopping = False
        self.next_memory_check = 0.0
        self.started: dict[WorkerProc, float] = {}  # monotonic start time, until "ready"
        self.start_failures = 0  # workers in a row that died before "ready"
        self.next_spawn = 0.0  # monotonic: no worker is started before (backoff)
        self.import_error = ""  # the last import error a worker reported (logged once)
        self.fatal: HandlerError | None = None  # workers cannot start: the supervisor gives up
        self.writing: set[WorkerProc] = set()  # pipes watched for writability
        self.dying: list[WorkerProc] = []  # killed, reaped once their sentinel is readable
        self.metrics: Tally | None = None  # counts for /metrics (runtime/metrics.py): on
        #: workers replaced, by why: timeout, crash, memory, max_jobs, start, swept
        self.replaced: dict[str, int] = defaultdict(int)

    def __iter__(self):
        return iter(list(self.procs))

    def __contains__(self, proc: object) -> bool:
        return proc in self.procs

    # ------------------------------------------------------------------ processes

    def _spawn(self) -> WorkerProc:
        proc = start_worker(self.handlers, self.env, self.results)
        self._watch(proc)
        return proc

    def _watch(self, proc: WorkerProc) -> None:
        proc.pipe.buffered = True  # sends never block the loop (flushed when writable)
        self.started[proc] = time.monotonic()
        self.procs.append(proc)
        self.events.register(proc.pipe.fileno(), ("conn", proc))
        self.events.register(proc.sentinel, ("exit", proc))

    def adopt(self, early: Early) -> None:
        """Take the workers started first (runtime/early.py) as if started here now: their
        "ready" (or exit) is read by the loop, their start timeout counts from now. Those
        started for other handlers, result queues or environment are stopped."""
        for proc in early.take(self.handlers, self.results, self.env):
            self._watch(proc)

    def ensure(self) -> None:
        """Start workers until `target` of them take jobs (not when stopping), at most
        `start_at_once` starting (not yet ready) at a time: the rest start as those are ready.
        A start is mostly imports, CPU-bound: more at once than cores only makes every one of
        them, and so the first job, wait longer (8 workers on 2 cores: 0.65 s to the first
        job, 2 workers 0.37 s; benchmarks/startup.py)."""
        if self.stopping or self.fatal is not None or time.monotonic() < self.next_spawn:
            return
        live = sum(1 for w in self.procs if w.healthy and not w.retiring)
        for _ in range(min(self.target - live, self.start_at_once - len(self.started))):
            self._spawn()

    def _forget(self, proc: WorkerProc) -> None:
        self.started.pop(proc, None)
        self.writing.discard(proc)
        self.events.unregister(proc.pipe.fileno())
        self.events.unregister(proc.sentinel)
        if proc in self.procs:
            self.procs.remove(proc)

    def kill(self, proc: WorkerProc) -> None:
        """SIGKILL it and its processes without waiting: its exit sentinel, still watched,
        has the loop reap it (`reap`). A worker slow to die (D state, a late reaper of its
        job's processes) never holds the loop."""
        self._forget(proc)
        proc.signal_kill()
        self.dying.append(proc)
        self.events.register(proc.sentinel, ("reap", proc))

    def reap(self, proc: WorkerProc) -> None:
        """A killed worker has exited: collect its status (no wait) and close its sentinel."""
        self.events.unregister(proc.sentinel)
        if proc in self.dying:
            self.dying.remove(proc)
        proc.close()

    def kill_all(self) -> None:
        for proc in list(self.procs):
            self.kill(proc)

    def close(self) -> None:
        """The supervisor's exit: kill every worker and wait (bounded) for each to exit."""
        self.kill_all()
        for proc in list(self.dying):
            self.reap(proc)

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
        """The monotonic time of the earliest timeout of a running job or a start-up, or of
        the next worker start after a backoff (inf: none)."""
        deadline = float("inf")
        for proc in self.procs:  # once per step: a loop, not a generator into min()
            if proc.next_timeout < deadline:
                deadline = proc.next_timeout
        if self.started:
            deadline = min(deadline, min(self.started.values()) + defaults.WORKER_START_TIMEOUT)
        if self.next_spawn:  # a start held back by a backoff
            deadline = min(deadline, self.next_spawn)
        return deadline

    def start_held_back(self, now: float) -> None:
        """Start the workers a backoff held back, once it has passed."""
        if self.next_spawn and now >= self.next_spawn:
            self.next_spawn = 0.0
            self.ensure()

    # ------------------------------------------------------------------ pipes

    def flush(self, proc: WorkerProc) -> None:
        """Its pipe is writable: send what waits (a worker that died is reaped by its exit)."""
        try:
            proc.pipe.flush()
        except OSError:
            proc.pipe.out.clear()

    def watch_writes(self) -> None:
        """Wake the loop when a pipe with output waiting becomes writable."""
        for proc in self.procs:
            waiting = bool(proc.pipe.out)
            if waiting or proc in self.writing:  # the selector is touched on a change only
                self.events.want_write(proc.pipe.fileno(), waiting)
                (self.writing.add if waiting else self.writing.discard)(proc)

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
            self.started.pop(proc, None)
            self.start_failures = 0
            self.ensure()  # the next held back by start_at_once
            return
        if message == "pong":  # unhealthy but not stuck: its other jobs go on (health.py)
            proc.ping_sent = 0.0
            proc.next_ping = time.monotonic() + defaults.WORKER_PING_TIMEOUT
            proc.next_timeout = min(proc.next_timeout, proc.next_ping)
            return
        if isinstance(message, list) and message and message[0] == "import-error":
            text = str(message[1]) if len(message) > 1 else "?"
            if text != self.import_error:  # once, not once per worker start
                log.error("worker %d could not load its handlers: %s", proc.pid, text)
                self.import_error = text
            return
        now = time.time()
        metrics, states, acks, take, pid = self.metrics, self.states, self.acks, proc.take, proc.pid
        for item in message:  # [seq, started, error] or [seq, started, None, result]
            job = take(item[0])
            if job is None:
                continue
            started, error = item[1], item[2]
            if metrics is not None:
                metrics.ran(job, started, now)
            state = states[job.queue]
            if job.pushed:  # park its slot again: a dequeue goes with the ack
                state.ready_at = 0.0
            if job.timed_out:  # a result that raced its timeout: the timeout wins
                acks.append(self.retry_ack(job, "timeout", pid, started))
                continue
            result = item[3] if len(item) > 3 and isinstance(item[3], str) else ""
            if error is None:  # the common case, without on_result's decisions
                acks.append(outcomes.finish(job, state.base, pid, started, result))
                continue
            acks.append(
                outcomes.on_result(
                    job, state.spec, state.base, state.fail_base, error, pid, started, now, result
                )
            )
        if self.max_jobs_per_worker and proc.done >= self.max_jobs_per_worker and proc.healthy:
            self._retire(proc, f"ran {proc.done} jobs", "max_jobs")

    def _retire(self, proc: WorkerProc, why: str, reason: str) -> None:
        if not proc.retiring:
            log.info("recycling worker %d (%s)", proc.pid, why)
            proc.retiring = True
            self.replaced[reason] += 1
            self.ensure()

    def on_exit(self, proc: WorkerProc) -> None:
        """A worker process ended: its unfinished jobs are retried, a new worker replaces it
        (after a backoff when it died before it was ready)."""
        self.receive(proc)
        self._forget(proc)
        code = proc.process.wait()
        if not proc.ready:
            self._start_failed(proc, f"exited with code {code} before it was ready")
        elif proc.jobs or not proc.retiring:
            self.replaced["crash"] += 1
            log.error(
                "worker %d exited with code %s holding %d job(s)", proc.pid, code, len(proc.jobs)
            )
        died = f"worker {proc.pid} exited with code {code}"
        self.requeue_held(proc, "stall", "WorkerDied", died)
        proc.close()
        self.ensure()

    def retry_ack(
        self,
        job: Running,
        kind: str,
        pid: int,
        started: int | str,
        error_name: str = "TimeoutError",
        message: str = "",
    ) -> outcomes.Ack:
        """Retry, counting `kind` ('timeout', 'stall', 'release'): a timed-out job after the
        queue's backoff for its timeout count (like any retry), the others at once. Logged:
        a timeout or a stall with the job's attempt and error, a release (shutdown) too."""
        state = self.states[job.queue]
        run_at = outcomes.NOW
        delay = 0.0
        if kind == "timeout":
            delay = outcomes.backoff_seconds(state.spec, job.timeout_count)
            run_at = outcomes.after(delay)
            message = message or (
                f"job passed its timeout of {state.spec.timeout:.3g}s on worker {pid}"
            )
        if kind == "release":
            log.warning(
                "job %s of %s handed back to waiting, not counted: %s",
                job.id,
                job.queue,
                message or error_name,
            )
        else:
            log.warning(
                "job %s of %s %s (attempt %d), retried in %.3gs: %s: %s",
                job.id,
                job.queue,
                "timed out" if kind == "timeout" else "stalled",
                outcomes.attempt(job),
                delay,
                error_name,
                message,
            )
        return outcomes.retry(job, state.base, run_at, kind, pid, started, error_name, message)

    def requeue_held(self, proc: WorkerProc, kind: str, error_name: str, message: str = "") -> None:
        """Retry every job `proc` held: a timed-out one as a timeout, the others as `kind`."""
        for job in list(proc.jobs.values()):
            if job.timed_out:
                self.acks.append(self.retry_ack(job, "timeout", proc.pid, ""))
            else:
                self.acks.append(self.retry_ack(job, kind, proc.pid, "", error_name, message))
        proc.jobs.clear()

    def stop_drained(self) -> None:
        """Tell each drained retiring worker to exit; its exit is reaped through its sentinel
        (on_exit), so the loop never blocks on it."""
        for proc in self.procs:
            if proc.retiring and not proc.jobs and not proc.stop_sent:
                proc.stop_sent = True
                try:
                    proc.pipe.send_frame(b'"stop"')
                except OSError:
                    kill_tree(proc.pid, wait=False)  # reaped through its sentinel (on_exit)

    def hand_back_all(self) -> None:
        """Shutdown: kill every worker and hand back the jobs they still held. Results a
        worker wrote before it died are read first: those jobs are acked, not run again."""
        for proc in list(self.procs):
            kill_tree(proc.pid)
            self.receive(proc)
            self.kill(proc)
            for job in proc.jobs.values():
                why = "the supervisor shut down before it ended"
                self.acks.append(self.retry_ack(job, "release", proc.pid, "", "Shutdown", why))
            proc.jobs.clear()
