"""The worker subprocess: runs handlers for the jobs its supervisor sends over a pipe.

Protocol (each message one orjson document in a frame of queasy_py/frames.py):
  supervisor -> worker: a batch of jobs (frames.pack_jobs: a header
                        [[seq, queue, id, run_at, retry, stall, timeout, trace,
                          data_length], ...]; trace: a W3C traceparent or ''
                        then each job's data as stored)
                        "stop"                              exit (sent when no job is left)
  worker -> supervisor: "ready" | ["import-error", message]              once, at start
                        [[seq, started_ms, error_or_null], ...]          results
                        ([seq, started_ms, null, value_json] for a queue storing results)
  error = {"name", "message", "kind": "permanent"|"retriable", "retry_at": secs|null,
           "traceback": str|null}
          (queasy_py/runtime/results.py: what a result holds, and how a batch is encoded)

Plain handlers run in a thread pool, async ones on one event loop thread, so a worker runs
several jobs at once. One pool thread at a time reads the pipe (the leader); once it has a
message it hands the reading to another pool thread, puts the message's plain jobs in a
backlog and runs them itself one after the other, while helper threads take jobs from the
backlog in parallel (each helper that finds a job calls in one more). Short jobs so run
without a thread switch each, long ones still run side by side. When the pipe closes (the
supervisor died) the worker exits at once with its process group and every process under
it, so no orphan keeps running a job that will be run again elsewhere.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import signal
import socket
import sys
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
from .handler import load
from .results import check_result, describe_error, encode_results, invalid_data, stored_result

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("queasy_py.worker")


class Runner:
    """Runs jobs concurrently and sends their results back in batches."""

    def __init__(
        self, pipe: Pipe, handlers: dict[str, str], results: frozenset[str] = frozenset()
    ) -> None:
        self.pipe = pipe
        self.parent = os.getppid()  # the supervisor: a job starts only while it lives
        self.handlers = {queue: load(path) for queue, path in handlers.items()}
        self.results = results  # the queues whose handlers' return values are stored
        # a job takes at least one unit, plus the thread reading the pipe
        self.pool = ThreadPoolExecutor(max_workers=defaults.WORKER_UNITS + 1)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_lock = threading.Lock()
        self.outbox: queue.SimpleQueue[list[Any]] = queue.SimpleQueue()
        self.backlog: collections.deque[tuple[int, Any, Any, Job]] = collections.deque()
        self.sender = threading.Thread(target=self._send_loop, name="queasy-sender", daemon=True)
        self.sender.start()

    def _start_async(self, coro: Any) -> None:
        import asyncio  # only for async handlers: it takes a third of a worker's start

        if self.loop is None:
            with self.loop_lock:  # pool threads start awaitables that plain handlers return
                if self.loop is None:
                    loop = asyncio.new_event_loop()
                    name = "queasy-async"
                    threading.Thread(target=loop.run_forever, name=name, daemon=True).start()
                    self.loop = loop
        asyncio.run_coroutine_threadsafe(coro, self.loop)

    def _send_loop(self) -> None:
        """Send results in batches. Nothing a result holds may end this thread: without it
        every later job of this worker would be recorded as timed out and run again."""
        while True:
            try:
                batch = [self.outbox.get()]
                while True:
                    try:
                        batch.append(self.outbox.get_nowait())
                    except queue.Empty:
                        break
                payload = encode_results(batch)
            except Exception:
                log.exception("worker failed encoding results")
                continue
            try:
                self.pipe.send_frame(payload)
            except (OSError, ValueError):
                exit_with_everything()  # the supervisor is gone

    def _done(self, seq: int, started: int, error: dict[str, Any] | None) -> None:
        self.outbox.put([seq, started, error])

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
            self.outbox.put([seq, started, None, value])

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

    def lead(self) -> None:
        """Read the next message, hand the reading on, run its jobs (the first plain one in
        this thread). Any failure here ends the worker: nobody else reads the pipe."""
        try:
            try:
                frame = self.pipe.recv_frame()
            except (EOFError, OSError):
                exit_with_everything()  # the supervisor is gone: stop at once, jobs included
            if os.getppid() != self.parent:  # it died after sending: start none of them
                exit_with_everything()
            if frame == b'"stop"':  # sent only to a worker with no jobs left
                os._exit(0)
            self.pool.submit(self.lead)
            plain = self.submit(frame)
        except BaseException:
            log.exception("worker failed reading its jobs")
            os._exit(1)
        if plain > 1:
            self.pool.submit(self.help)
        self.drain()

    def help(self) -> None:
        """Take a job from the backlog, calling in one more helper while jobs are left."""
        try:
            item = self.backlog.popleft()
        except IndexError:
            return
        if self.backlog:
            self.pool.submit(self.help)
        self.run_sync(*item)
        self.drain()

    def drain(self) -> None:
        while True:
            try:
                item = self.backlog.popleft()
            except IndexError:
                return
            self.run_sync(*item)

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


def exit_with_everything() -> None:
    """Exit at once, taking every process a job started: those still under this worker
    (also in a session of their own) and, the worker being the leader of its own process
    group (pool.start_worker), the group: background children that init adopted too."""
    try:
        import psutil  # only on this path

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    except Exception:  # exit anyway
        pass
    if os.getpgrp() == os.getpid():
        os.killpg(0, signal.SIGKILL)
    os._exit(0)


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
    logging.basicConfig(level=log_level(), stream=sys.stderr, format=defaults.LOG_FORMAT)
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
