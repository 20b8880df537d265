"""The producer API of one queue: dispatch, cancel, get_job, counts, result (and listen),
and what operators need: jobs by state, requeue of failed jobs, purge, the outcome events."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from . import defaults, validate
from .connfailed import as_connection_failed
from .job import JobInfo, ScheduleInfo
from .operate import Operate
from .queue_base import BatchResult, QueueBase
from .store.keys import RegistryKeys
from .store.lazyredis import redis
from .store.library import Dispatched, lua_error
from .store.reload import fcall_pipelined
from .tracing import traceparent

if TYPE_CHECKING:
    from .client import Client
    from .options import ListenOptions

log = logging.getLogger("queasy_py")


class Queue(QueueBase, Operate):
    """A named queue. Get one with Client.queue(name)."""

    client: Client

    @property
    def fail_queue(self) -> Queue:
        """The queue of this queue's fail jobs (same hash tag, name + '-fail')."""
        name = self.name + defaults.FAIL_QUEUE_SUFFIX
        return self.client._queue(name, self.keys.tag)

    @as_connection_failed
    def dispatch(
        self,
        data: Any,
        id: str | None = None,
        run_at: Any = None,
        delay: float | None = None,
        update_data: bool = True,
        update_run_at: bool | str = True,
        reset_counts: bool | None = None,
    ) -> str:
        """Add a job (or update the waiting/blocked job with this id). Returns its id."""
        args = self._dispatch_args(
            data, id, run_at, delay, update_data, update_run_at, reset_counts
        )
        self._register()
        try:
            self.client.fastcall("queasy_dispatch", [self.keys.base], args)
        except redis.ResponseError as exc:
            raise lua_error(exc) from None
        return args[5]

    def _dispatch_letter(self, data: Any, id: str, failed_run_at: Any) -> bool:
        """Dispatch a dead letter's job (queasy_py.handlers.dead_letter) unless its id is
        live or ended since the failure the letter records (`failed_run_at`: that run's
        run_at in seconds, or None when the letter does not say), in one library step.
        True when it was dispatched."""
        job_id, encoded, _ = self._encode(data, id, None, None)
        at = "" if failed_run_at is None else round(failed_run_at * 1000)
        self._register()
        try:
            code = self.client.fastcall(
                "queasy_dispatch_letter", [self.keys.base], ["", traceparent(), job_id, encoded, at]
            )
        except redis.ResponseError as exc:
            raise lua_error(exc) from None
        return int(code) == Dispatched.CREATED

    @as_connection_failed
    def dispatch_many(
        self,
        jobs: Iterable[Mapping[str, Any]],
        update_data: bool = True,
        update_run_at: bool | str = True,
        reset_counts: bool | None = None,
    ) -> list[str]:
        """Dispatch many jobs in pipelined batches. Every job is checked before any is sent."""
        chunks, ids = self._dispatch_many_args(jobs, update_data, update_run_at, reset_counts)
        self._check_reserved(ids, chunks)
        if chunks:
            self._register()
            self._pipelined("queasy_dispatch", chunks)
        return ids

    def _pipelined(self, name: str, chunks: list[list]) -> list:
        """FCALL `name` once per chunk of arguments, pipelined in one round trip; their
        replies. On one server sent once (store/calls.py: never again after a lost reply);
        on a cluster a primary's lost library loaded again (store/reload.fcall_pipelined)."""
        try:
            if not self.client.cluster:
                return self.client.fastcall.pipelined(name, [self.keys.base], chunks)
            return fcall_pipelined(self.client.redis, name, self.keys.base, chunks)
        except redis.ResponseError as exc:
            raise self._refused(exc, chunks) from None

    def _register(self) -> None:
        """Put this queue's name in the registry (Client.queues), once per Queue object."""
        if self._wants_register():
            try:
                self.client.redis.sadd(RegistryKeys(self.client.prefix).queues, self.name)
            except redis.exceptions.NoPermissionError as exc:
                raise lua_error(exc) from None  # a key outside the user's ~PREFIX:*
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._unregistered(exc)
                return
            self.registered = True

    @as_connection_failed
    def dispatch_batch(
        self,
        jobs: Iterable[Mapping[str, Any]],
        update_data: bool = True,
        update_run_at: bool | str = True,
        reset_counts: bool | None = None,
        *,
        dedup_window: float | None = None,
    ) -> BatchResult:
        """dispatch_many that says what happened to each job (BatchResult).

        With `dedup_window` (seconds) the batch may be sent again without running an id twice
        (a retried Spark task, a re-run job): an id whose job is active is skipped, and so is
        one with no waiting job that a dispatch_batch with a dedup_window sent within the
        window (it ran, failed or was cancelled since); the window of an id ends
        `dedup_window` after its run_at. Waiting and delayed jobs are updated as usual.
        """
        window = None if dedup_window is None else self._window_ms(dedup_window)
        chunks, ids = self._dispatch_many_args(jobs, update_data, update_run_at, reset_counts)
        self._check_reserved(ids, chunks)
        return self._send_batch(chunks, ids, window)

    def _check_reserved(self, ids: list[str], chunks: list[list]) -> None:
        index = self._reserved_at(ids, chunks)
        if index is not None:
            self._refuse_reserved(index, self.schedule_info())

    def _send_batch(self, chunks: list[list], ids: list[str], window: int | None) -> BatchResult:
        """Send dispatch_batch's chunks, pipelined in one round trip."""
        name, chunks = self._batch_calls(chunks, window)
        codes: list[Dispatched] = []
        if chunks:
            self._register()
            replies = self._pipelined(name, chunks)
            codes = [Dispatched(int(code)) for reply in replies for code in reply]
        return BatchResult(ids, codes)

    # ------------------------------------------------------------------ inspect

    @as_connection_failed
    def cancel(self, job_id: str) -> bool:
        """Remove a waiting, delayed or blocked job. An active job is never touched."""
        return bool(self._call("queasy_cancel", self._cancel_args(job_id)))

    @as_connection_failed
    def get_job(self, job_id: str) -> JobInfo | None:
        """The active job with this id, else the waiting (or delayed/blocked) one, else the
        record of its end (finished, failed, cancelled) while it is kept; else None."""
        validate.job_id(job_id)
        return self._job_info(
            self.client.redis.fcall_ro("queasy_get_job", 1, self.keys.base, "", job_id)
        )

    @as_connection_failed
    def counts(self) -> dict[str, int]:
        """Jobs per state {"waiting", "delayed", "blocked", "active"}, the totals of
        "finished" and "failed" since reset_totals(), and those of the last minute and hour
        ("finished_last_minute", "failed_last_minute", "finished_last_hour",
        "failed_last_hour"; the last minute's is the per-minute rate)."""
        return self._counts(self.client.redis.fcall_ro("queasy_counts", 1, self.keys.base, ""))

    @as_connection_failed
    def schedule_info(self) -> ScheduleInfo | None:
        """This queue's schedule (listen(schedule=...)): its spec, the current occurrence's
        fire time and state, the last outcome; None when it never had one."""
        return self._schedule_info(
            self.client.redis.fcall_ro("queasy_schedule_info", 1, self.keys.base, "")
        )

    @as_connection_failed
    def drop_schedule(self) -> bool:
        """Drop this queue's schedule once it is gone from every supervisor's config: its
        pending occurrence is cancelled and its record goes (schedule_info() is None, the id
        `schedule` is a plain id again). False when it has none; InvalidInput, nothing
        dropped, while its occurrence runs or a supervisor still keeps it going."""
        for cancelled in (False, True):
            dropped = self._unscheduled(self._call("queasy_unschedule", [""]), cancelled)
            if dropped is not None:
                return dropped
            self.cancel(defaults.SCHEDULE_ID)
        raise AssertionError("unreachable: the second reply decides")

    # ------------------------------------------------------------------ listen

    def listen(self, handler: str, **options: Any) -> ListenOptions:
        """Run this queue's jobs with `handler` (a module path) in this client's supervisor."""
        from .options import ListenOptions

        spec = ListenOptions.build(self.name, handler, options)
        self.client._add_listener(self, spec)
        return spec
