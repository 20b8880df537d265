"""The producer API of one queue: dispatch, cancel, get_job, counts, result (and listen),
and what operators need: jobs by state, requeue of failed jobs, purge, the outcome events."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import redis

from . import defaults, records, validate
from .errors import InvalidInput, ResultTimeout
from .job import END_STATES, JobInfo
from .store import stream
from .store.keys import QueueKeys, RegistryKeys
from .store.library import fcall, lua_error

if TYPE_CHECKING:
    from .client import Client
    from .options import ListenOptions

#: jobs per FCALL in dispatch_many (the chunks are pipelined in one round trip)
DISPATCH_CHUNK = 500
#: jobs per call of queasy_jobs (the most), queasy_requeue and queasy_purge
PAGE = 1000
LISTED = ("waiting", "delayed", "blocked", "active", *END_STATES)
#: what purge("all") removes, in this order: every state but active
PURGED = ("waiting", "delayed", "blocked", "cancelled", "finished", "failed")
#: the longest wait of result() on one read before it looks at the job again
RESULT_WAIT = 3600.0


def new_job_id() -> str:
    """A unique, URL-safe job id: 128 random bits as 32 hex characters (a uuid4 object
    costs four times as much, a tenth of a dispatch_many)."""
    return os.urandom(16).hex()


class QueueBase:
    """Validation, FCALL arguments and reply parsing shared by Queue and aio.AsyncQueue."""

    def __init__(self, client: Any, name: str, tag: str | None = None) -> None:
        self.client = client
        self.name = validate.queue_name(name)
        self.keys = QueueKeys(client.prefix, self.name, tag or self.name)
        self.registered = False  # its name is in the registry of queues (Client.queues)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    def _flags(self, update_data: bool, update_run_at: object, reset_counts: bool | None) -> list:
        if not isinstance(update_data, bool):
            raise InvalidInput(f"update_data must be True or False, not {update_data!r}")
        if reset_counts is None:
            reset_counts = update_data
        elif not isinstance(reset_counts, bool):
            raise InvalidInput(f"reset_counts must be True, False or None, not {reset_counts!r}")
        mode = validate.run_at_mode(update_run_at)
        return ["1" if update_data else "0", mode, "1" if reset_counts else "0"]

    def _encode(self, data: Any, id: str | None, run_at: Any, delay: Any) -> list:
        job_id = new_job_id() if id is None else validate.job_id(id)
        encoded = validate.encode_data(data, self.client.max_payload)
        at = validate.run_at_ms(run_at, delay, time.time())
        return [job_id, encoded, "" if at is None else at]

    def _dispatch_args(
        self,
        data: Any,
        id: str | None,
        run_at: Any,
        delay: Any,
        update_data: bool,
        update_run_at: object,
        reset_counts: bool | None,
    ) -> list:
        """ARGV of queasy_dispatch for one job; its id is ARGV[5] (index 4)."""
        flags = self._flags(update_data, update_run_at, reset_counts)
        return ["", *flags, *self._encode(data, id, run_at, delay)]

    def _dispatch_many_args(
        self,
        jobs: Iterable[Mapping[str, Any]],
        update_data: bool,
        update_run_at: object,
        reset_counts: bool | None,
    ) -> tuple[list[list], list[str]]:
        """ARGV of each queasy_dispatch chunk, and the ids. Checks every job first."""
        flags = self._flags(update_data, update_run_at, reset_counts)
        args: list[Any] = []
        for index, job in enumerate(jobs):
            if not isinstance(job, Mapping) or "data" not in job:
                raise InvalidInput(f"jobs[{index}] must be a mapping with a 'data' key")
            unknown = set(job) - {"data", "id", "run_at", "delay"}
            if unknown:
                raise InvalidInput(f"jobs[{index}] has unknown keys {sorted(unknown)}")
            try:
                args.extend(
                    self._encode(job["data"], job.get("id"), job.get("run_at"), job.get("delay"))
                )
            except InvalidInput as exc:
                raise InvalidInput(f"jobs[{index}]: {exc}") from None
        step = DISPATCH_CHUNK * 3
        chunks = [["", *flags, *args[i : i + step]] for i in range(0, len(args), step)]
        return chunks, args[0::3]

    def _cancel_args(self, job_id: str) -> list:
        keep = defaults.KEEP_CANCELLED
        keep_ms = int(keep["seconds"] * 1000)
        return ["", defaults.EVENTS_MAXLEN, validate.job_id(job_id), keep["count"], keep_ms]

    def _job_info(self, row: list | None) -> JobInfo | None:
        return records.job_info(self.name, row)

    def _jobs_args(self, state: str, cursor: str, limit: int, with_data: bool) -> list:
        if state not in LISTED:
            raise InvalidInput(f"state must be one of {', '.join(LISTED)}, not {state!r}")
        if not isinstance(cursor, str) or not cursor or len(cursor) > 40:
            raise InvalidInput(f"cursor must be '0' or the one a page returned, not {cursor!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= PAGE:
            raise InvalidInput(f"limit must be an int 1..{PAGE}, not {limit!r}")
        return ["", state, cursor, limit, "1" if with_data else "0"]

    @staticmethod
    def _purged(state: str) -> tuple[str, ...]:
        if state == "all":
            return PURGED
        if state not in PURGED:
            raise InvalidInput(
                f"purge state must be one of {', '.join(PURGED)} or all (never active), "
                f"not {state!r}"
            )
        return (state,)

    @staticmethod
    def _requeue_chunks(ids: Iterable[str]) -> list[list[str]]:
        if isinstance(ids, str):
            raise InvalidInput("ids must be a list of job ids, not a str")
        checked = [validate.job_id(i) for i in ids]
        return [checked[i : i + PAGE] for i in range(0, len(checked), PAGE)]

    @staticmethod
    def _deadline(timeout: float | None) -> float | None:
        if timeout is None:
            return None
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not (0 <= timeout <= validate.MAX_DURATION)
        ):
            raise InvalidInput(f"timeout must be None or seconds >= 0, not {timeout!r}")
        return time.monotonic() + timeout

    def _timed_out(self, job_id: str, timeout: float | None) -> ResultTimeout:
        return ResultTimeout(f"job {job_id} of {self.name} did not end within {timeout}s")

    @staticmethod
    def _counts(row: list) -> dict[str, int]:
        return records.counts(row)


class Queue(QueueBase):
    """A named queue. Get one with Client.queue(name)."""

    client: Client

    @property
    def fail_queue(self) -> Queue:
        """The queue of this queue's fail jobs (same hash tag, name + '-fail')."""
        name = self.name + defaults.FAIL_QUEUE_SUFFIX
        return self.client._queue(name, self.keys.tag)

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
        return args[4]

    def dispatch_many(
        self,
        jobs: Iterable[Mapping[str, Any]],
        update_data: bool = True,
        update_run_at: bool | str = True,
        reset_counts: bool | None = None,
    ) -> list[str]:
        """Dispatch many jobs in pipelined batches. Every job is checked before any is sent."""
        chunks, ids = self._dispatch_many_args(jobs, update_data, update_run_at, reset_counts)
        if chunks:
            self._register()
            with self.client.redis.pipeline(transaction=False) as pipe:
                for args in chunks:
                    fcall(pipe, "queasy_dispatch", [self.keys.base], args)
                try:
                    pipe.execute()
                except redis.ResponseError as exc:
                    raise lua_error(exc) from None
        return ids

    def _register(self) -> None:
        """Put this queue's name in the registry (Client.queues), once per Queue object."""
        if not self.registered:
            self.client.redis.sadd(RegistryKeys(self.client.prefix).queues, self.name)
            self.registered = True

    # ------------------------------------------------------------------ inspect

    def cancel(self, job_id: str) -> bool:
        """Remove a waiting, delayed or blocked job. An active job is never touched."""
        args = self._cancel_args(job_id)
        try:
            return bool(fcall(self.client.redis, "queasy_cancel", [self.keys.base], args))
        except redis.ResponseError as exc:
            raise lua_error(exc) from None

    def get_job(self, job_id: str) -> JobInfo | None:
        """The active job with this id, else the waiting (or delayed/blocked) one, else the
        record of its end (finished, failed, cancelled) while it is kept; else None."""
        validate.job_id(job_id)
        return self._job_info(
            self.client.redis.fcall_ro("queasy_get_job", 1, self.keys.base, "", job_id)
        )

    def counts(self) -> dict[str, int]:
        """Jobs per state {"waiting", "delayed", "blocked", "active"}, the totals of
        "finished" and "failed" since reset_totals(), and those of the last minute and hour
        ("finished_last_minute", "failed_last_minute", "finished_last_hour",
        "failed_last_hour"; the last minute's is the per-minute rate)."""
        return self._counts(self.client.redis.fcall_ro("queasy_counts", 1, self.keys.base, ""))

    def reset_totals(self) -> None:
        """Start the finished and failed totals (and their per-minute counts) from 0."""
        self.client.redis.delete(self.keys.stats)

    def jobs(
        self, state: str, cursor: str = "0", limit: int = 100, with_data: bool = False
    ) -> tuple[list[JobInfo], str]:
        """One page of the jobs in `state` (waiting, delayed, blocked, active, finished,
        failed, cancelled) and the cursor of the next page ("0" after the last): pass it
        back for the next. Each call is bounded (`limit` <= 1000); waiting and delayed come
        by run_at, ended ones newest first. `data` is None unless `with_data`."""
        args = self._jobs_args(state, cursor, limit, with_data)
        reply = self.client.redis.fcall_ro("queasy_jobs", 1, self.keys.base, *args)
        return records.page(self.name, reply)

    def requeue_failed(self, ids: Iterable[str] | None = None) -> int:
        """Dispatch failed jobs (their kept records) again, to run now with counts 0: those
        with these ids, or every one that had failed when this was called. Their records
        go; returns how many were requeued."""
        total = 0
        if ids is not None:
            for chunk in self._requeue_chunks(ids):
                total += self._call("queasy_requeue", ["", "", PAGE, *chunk])[0]
            return total
        cutoff = ""
        while True:
            done, cutoff, seen = self._call("queasy_requeue", ["", cutoff, PAGE])
            total += done
            if seen < PAGE:
                return total

    def purge(self, state: str) -> int:
        """Remove the jobs in `state` (waiting, delayed, blocked, finished, failed, cancelled,
        or all of those); never an active job. Returns how many were removed. No event is
        written for them."""
        total = 0
        for name in self._purged(state):
            bound = None
            while True:
                removed, left = self._call("queasy_purge", ["", name, PAGE])
                total += removed
                bound = removed + left if bound is None else bound - removed
                if removed < PAGE or bound <= 0:
                    break
        return total

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """Wait for job `job_id` to end and return its handler's return value (None if its
        queue does not store results). JobFailed when it failed for good or was cancelled,
        JobNotFound for an unknown id, ResultTimeout after `timeout` seconds. The waiter is
        woken by the end itself (a message on the job's channel, published when the
        queue stores results; a queue that does not is seen at the timeout only)."""
        validate.job_id(job_id)
        deadline = self._deadline(timeout)
        with self.client.redis.pubsub(ignore_subscribe_messages=True) as pubsub:
            pubsub.subscribe(self.keys.done(job_id))
            while True:  # subscribed first: an end after this look is a message
                done, value = records.outcome(self.get_job(job_id), job_id, self.name)
                if done:
                    return value
                left = RESULT_WAIT if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise self._timed_out(job_id, timeout)
                pubsub.get_message(timeout=min(left, RESULT_WAIT))

    def events(self, after: str = "0", count: int = 100) -> list[dict[str, Any]]:
        """Up to `count` outcome events after event id `after` ("0": the oldest kept),
        oldest first; each event's `event_id` is the `after` of the next read (README
        "Outcome events")."""
        return stream.read(self.client.redis, self.keys.events, after, count)

    def _call(self, name: str, args: list) -> Any:
        try:
            return fcall(self.client.redis, name, [self.keys.base], args)
        except redis.ResponseError as exc:
            raise lua_error(exc) from None

    # ------------------------------------------------------------------ listen

    def listen(self, handler: str, **options: Any) -> ListenOptions:
        """Run this queue's jobs with `handler` (a module path) in this client's supervisor."""
        from .options import ListenOptions

        spec = ListenOptions.build(self.name, handler, options)
        self.client._add_listener(self, spec)
        return spec
