"""The worker subprocess: runs handlers for the jobs its supervisor sends over a pipe.

Protocol (each message one orjson document in a frame of queasy_py/frames.py):
  supervisor -> worker: a batch of jobs (frames.pack_jobs: a header
                        [[seq, queue, id, run_at, retry, stall, timeout, trace,
                          data_length], ...]; trace: a W3C traceparent or ''
                        then each job's data as stored)
                        "stop"                              exit (sent when no job is left)
                        "ping"                              answered "pong" from the event
                                                            loop if any (a worker with a
                                                            timed-out job: is it stuck?)
  worker -> supervisor: "ready" | ["import-error", message]              once, at start
                        "pong"                                           to each "ping"
                        [[seq, started_ms, error_or_null], ...]          results
                        ([seq, started_ms, null, value_json] for a queue storing results)
  error = {"name", "message", "kind": "permanent"|"retriable", "retry_at": secs|null,
           "traceback": str|null}
          (queasy_py/runtime/results.py: what a result holds, and how a batch is encoded)

Plain handlers run in a thread pool, async ones on one event loop thread, so a worker runs
several jobs at once. One pool thread at a time reads the pipe (the reader): it puts a
message's plain jobs in a backlog, runs them itself one after the other, sends their results
in one message and reads the next. A watch thread looks every HAND_OVER_S while messages
come: a reader still on the same message as at the last look hands the reading to another
pool thread and the rest of the backlog to helpers (each helper that finds a job calls in
one more), so the jobs of a batch and of the next ones run side by side. A batch of quick
jobs so costs no thread switch at all (the switches, 8-10 per message, were most of a
worker's CPU per job), long ones start side by side within 2-4 ms. Every thread that adds
results sends what is waiting after its last job (no sender thread to wake); a result that
waits a tick (a slow job ran after it in the same thread) is sent by the watch, or by the
reader a hand-over starts. When the pipe closes (the
supervisor died) the worker exits at once with its process group and every process under
it, so no orphan keeps running a job that will be run again elsewhere.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from inspect import isawaitable
from typing import TYPE_CHECKING, Any

import orjson

from .. import defaults
from ..job import Job
from ..tracing import traced
from .frames import Pipe, job_heads
from .guards import LogStream, run_loop
from .handler import load
from .inbox import exit_with_everything, handled
from .results import check_result, describe_error, encode_results, invalid_data, stored_result

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("queasy_py.worker")

#: the watch's tick: a reader found on the same message at two looks in a row (2-4 ms on it)
#: hands the reading to another thread and the rest of its batch to helpers
HAND_OVER_S = 0.002


class Runner:
    """Runs jobs concurrently and sends their results back in batches."""

    def __init__(
        self,
        pipe: Pipe,
        handlers: dict[str, str],
        results: frozenset[str] = frozenset(),
        hand_over: float | None = None,
    ) -> None:
        self.pipe = pipe
        self.hand_over = HAND_OVER_S if hand_over is None else hand_over  # the watch's tick
        self.parent = os.getppid()  # the supervisor: a job starts only while it lives
        self.handlers = {queue: load(path) for queue, path in handlers.items()}
        self.results = results  # the queues whose handlers' return values are stored
        # a job takes at least one unit, plus the thread reading the pipe
        self.pool = ThreadPoolExecutor(max_workers=defaults.WORKER_UNITS + 1)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_lock = threading.Lock()
        self.outbox: collections.deque[list[Any]] = collections.deque()
        self.send_lock = threading.Lock()
        self.flush_pending = False  # the event loop's flush of async results is scheduled
        self.backlog: collections.deque[tuple[int, Any, Any, Job]] = collections.deque()
        # the reading thread and its watch (_watch): who reads, whether it is running jobs
        self.lock = threading.Lock()
        self.reader = 0  # the reading thread's turn: a thread whose turn passed stops reading
        self.running = False  # the reading thread is on a message (not waiting in recv)
        self.progress = 0  # messages read: the watch sees whether the reader moves on
        self.active = threading.Event()  # set while messages come: the watch looks every tick
        threading.Thread(target=self._watch, name="queasy-watch", daemon=True).start()

    def _start_async(self, coro: Any) -> None:
        import asyncio  # only for async handlers: it takes a third of a worker's start

        if self.loop is None:
            with self.loop_lock:  # pool threads start awaitables that plain handlers return
                if self.loop is None:
                    loop = asyncio.new_event_loop()
                    name = "queasy-async"
                    threading.Thread(target=run_loop, args=(loop,), name=name, daemon=True).start()
                    self.loop = loop
        asyncio.run_coroutine_threadsafe(coro, self.loop)

    def flush(self, wait: bool = True) -> None:
        """Send the results waiting, in one message. Every thread that adds a result flushes
        after the jobs it runs one after the other; the watch (_watch) sends one that waited
        a tick (a slow job ran after it in the same thread), without waiting for send_lock
        (`wait` False: whoever holds it sends). Nothing a result holds may stop this: the
        worker's later jobs would all be recorded as timed out and run again."""
        if not self.send_lock.acquire(blocking=wait):
            return
        try:
            if not self.outbox:
                return
            batch = []
            while self.outbox:
                batch.append(self.outbox.popleft())
            try:
                payload = encode_results(batch)
            except Exception:
                log.exception("worker failed encoding results")
                return
            try:
                self.pipe.send_frame(payload)
            except (OSError, ValueError):
                exit_with_everything()  # the supervisor is gone
        finally:
            self.send_lock.release()

    def _flush_soon(self) -> None:
        """On the event loop: one flush for the async results of this loop iteration."""
        if not self.flush_pending:
            self.flush_pending = True
            assert self.loop is not None
            self.loop.call_soon(self._flush_async)

    def _flush_async(self) -> None:
        self.flush_pending = False
        self.flush()

    def _done(self, seq: int, started: int, error: dict[str, Any] | None) -> None:
        self._add([seq, started, error])

    def _add(self, result: list[Any]) -> None:
        self.outbox.append(result)
        if not self.active.is_set():  # the watch sends a result that waits a tick
            self.active.set()

    def _returned(self, seq: int, started: int, result: Any, job: Job) -> None:
        """A handler returned `result`: sent along when its queue stores results (a value
        that is not JSON fails that job: InvalidResult), else only checked."""
        if job.queue not in self.results:
            check_result(result, job)
            self._done(seq, started, None)
            return
        value, error = stored_result(result, job)
        if error is not None:
            self._done(seq, started, error)
        else:
            self._add([seq, started, None, value])

    def run_sync(self, seq: int, handle: Any, data: Any, job: Job) -> None:
        if os.getppid() != self.parent:  # the supervisor died: its leases go to others
            exit_with_everything()
        started = int(time.time() * 1000)
        try:
            result = handle(data, job)
            if result is not None and isawaitable(result):
                # a sync wrapper around an async def: run what it returned on the loop
                self._start_async(self.run_awaitable(seq, started, result, job))
                return
        except BaseException as exc:  # noqa: BLE001 - every failure is reported
            self._done(seq, started, describe_error(exc))
        else:
            self._returned(seq, started, result, job)

    async def run_async(self, seq: int, handle: Any, data: Any, job: Job) -> None:
        started = int(time.time() * 1000)
        try:
            aw = handle(data, job)
        except BaseException as exc:  # noqa: BLE001
            self._done(seq, started, describe_error(exc))
            self._flush_soon()
            return
        await self.run_awaitable(seq, started, aw, job)

    async def run_awaitable(self, seq: int, started: int, aw: Any, job: Job) -> None:
        """Await a handler's awaitable (and any awaitable it resolves to); report the outcome."""
        try:
            result = await aw
            while result is not None and isawaitable(result):
                result = await result
        except BaseException as exc:  # noqa: BLE001
            self._done(seq, started, describe_error(exc))
        else:
            self._returned(seq, started, result, job)
        self._flush_soon()

    def lead(self) -> None:
        """Read messages and run their plain jobs in this thread, one after the other, then
        send their results; the watch (_watch) hands the reading to another thread, and the
        rest of the batch to helpers, when one message holds it for a tick. Any failure here
        ends the worker: nobody else reads the pipe. A reader started by a hand-over first
        sends what its predecessor's jobs left before it: the results of the quick jobs that
        ran ahead of the one that held it, which must not wait for that one to end."""
        self.flush()
        while True:
            try:
                try:
                    frame = self.pipe.recv_frame()
                except (EOFError, OSError):
                    exit_with_everything()  # the supervisor is gone: stop at once, jobs too
                if os.getppid() != self.parent:  # it died after sending: start none of them
                    exit_with_everything()
                if handled(frame, self.pipe, self.send_lock, self.loop):  # stop, ping: inbox
                    continue
                with self.lock:
                    turn = self.reader
                    self.running = True
                    self.progress += 1
                    if not self.active.is_set():
                        self.active.set()
                self.submit(frame)
                if self.reader != turn and self.backlog:
                    # handed over before the batch was in the backlog (the watch found
                    # none to give helpers): they take it now, not this thread alone
                    self.pool.submit(self.help)
            except BaseException:
                log.exception("worker failed reading its jobs")
                os._exit(1)
            self.drain()
            self.flush()
            with self.lock:
                if self.reader != turn:  # handed over while it ran a job: another one reads
                    return
                self.running = False

    def _watch(self) -> None:
        """Every HAND_OVER_S while messages come: a reader on the same message as at the
        last look hands the reading to a new thread and the rest of its batch to helpers,
        so the jobs of a batch, and of the next ones, run side by side. A quiet tick (no
        message since the last look, the reader waiting) puts the watch to sleep until the
        next message."""
        while True:
            self.active.wait()
            seen = self.progress
            oldest = self._oldest()
            time.sleep(self.hand_over)
            if oldest is not None and self._oldest() is oldest:
                self.flush(wait=False)  # a result waited a tick: its thread is on a slow job
            with self.lock:
                if self.progress != seen:
                    continue
                if not self.running:
                    self.active.clear()  # idle: no batch came for a tick
                    if self.outbox:  # unless results wait (_add): the watch sends them
                        self.active.set()
                    continue
                self.reader += 1  # the reading thread's turn ends with its job
                self.running = False
                self.pool.submit(self.lead)
                if self.backlog:
                    self.pool.submit(self.help)

    def _oldest(self) -> list[Any] | None:
        """The result waiting longest, None when none waits."""
        try:
            return self.outbox[0]
        except IndexError:
            return None

    def help(self) -> None:
        """Take a job from the backlog, calling in one more helper while jobs are left."""
        try:
            item = self.backlog.popleft()
        except IndexError:
            return
        if self.backlog:
            self.pool.submit(self.help)
        self._run(item)
        self.drain()
        self.flush()

    def drain(self) -> None:
        """Run the backlog's jobs in this thread, one after the other. Their results are
        sent after the last one (lead, help); one that waits a tick for a slow job after it
        is sent by the watch (_watch)."""
        while True:
            try:
                item = self.backlog.popleft()
            except IndexError:
                return
            self._run(item)

    def _run(self, item: tuple[int, Any, Any, Job]) -> None:
        try:
            self.run_sync(*item)
        except Exception:  # ours, not the handler's (run_sync reports those): the
            # thread must go on; the job, its result unsent, times out
            log.exception("worker failed reporting job %s", item[3].id)

    def submit(self, frame: bytes) -> int:
        """Start the async jobs of a batch, put the plain ones in the backlog; their number.
        A job whose data does not decode fails permanently (InvalidJobData), alone."""
        plain = 0
        heads, pos = job_heads(frame)
        for seq, queue_name, job_id, run_at, retries, stalls, timeouts, trace, size in heads:
            raw = frame[pos : pos + size]
            pos += size
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                self._done(seq, int(time.time() * 1000), invalid_data(job_id, raw, exc))
                continue
            handle, is_async = self.handlers[queue_name]
            if trace:  # its dispatch had a current span (tracing.py)
                handle = traced(handle, is_async, trace)
            job = Job(job_id, queue_name, run_at / 1000.0, retries, stalls, timeouts)
            if is_async:
                coro = self.run_async(seq, handle, data, job)
                self._start_async(coro)
            else:
                self.backlog.append((seq, handle, data, job))
                plain += 1
        return plain


def log_level() -> int:
    """The supervisor's logging level (pool.start_worker), else INFO."""
    try:
        return int(os.environ.get(defaults.LOG_LEVEL_ENV, logging.INFO))
    except ValueError:
        return logging.INFO


def _not_now(signum: int, frame: object) -> None:
    """SIGINT and SIGTERM to a worker: ignored (its supervisor stops it)."""


def main(pipe: Pipe, handlers: dict[str, str], results: frozenset[str] = frozenset()) -> None:
    """Run a worker on `pipe` for `handlers` ({queue: module path}); the return values of
    the queues in `results` are sent back."""
    # The supervisor decides when we stop: a signal to the whole process group (Ctrl-C, or
    # systemd's SIGTERM to every process of the unit) must not kill running jobs it drains.
    # A handler that does nothing, not SIG_IGN: an ignored signal stays ignored across exec,
    # and every process a job started would then shrug off SIGTERM and SIGINT too.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _not_now)
    logging.basicConfig(level=log_level(), handlers=[LogStream()], format=defaults.LOG_FORMAT)
    try:
        runner = Runner(pipe, handlers, results)
    except Exception as exc:
        pipe.send_frame(orjson.dumps(["import-error", str(exc)]))
        os._exit(3)
    pipe.send_frame(b'"ready"')
    runner.pool.submit(runner.lead)
    threading.Event().wait()  # every exit is an os._exit from a pool thread


def run(argv: list[str]) -> None:
    """Entry point of a worker process (pool.start_worker): argv = [FD, HANDLERS_JSON,
    RESULT_QUEUES_JSON (optional)]."""
    results = frozenset(orjson.loads(argv[2])) if len(argv) > 2 else frozenset()
    main(Pipe(socket.socket(fileno=int(argv[0]))), orjson.loads(argv[1]), results)
