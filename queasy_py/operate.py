"""What operators ask of a queue beside dispatch (issue #11): its jobs by state a page at a
time, requeue of failed jobs, purge, a job's result, the outcome events. The argument checks
are shared with aio.AsyncQueue (OperateArgs); Operate is Queue's side of them. Every call is
bounded: listing pages, requeue and purge loop over FCALLs of at most PAGE jobs."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from . import defaults, records, validate
from .connfailed import as_connection_failed
from .defaults import SCHEDULE_ID
from .errors import ClientClosed, ConnectionFailed, InvalidInput, QueasyError, ResultTimeout
from .job import END_STATES, JobInfo
from .store import events, fields
from .store.lazyredis import redis
from .store.library import fcall, lua_error
from .waits import ResultWake

log = logging.getLogger("queasy_py")

#: jobs per call of queasy_jobs (the most), queasy_requeue and queasy_purge
PAGE = 1000
LISTED = ("waiting", "delayed", "blocked", "active", *END_STATES)
#: what purge("all") removes, in this order: every state but active
PURGED = ("waiting", "delayed", "blocked", "cancelled", "finished", "failed")
#: the longest cursor a page returns: of active jobs '<client id>.<HSCAN cursor>' (library
#: 5.1.1), a client id of up to 256 characters and up to 20 digits
CURSOR_CHARS = validate.MAX_ID_LENGTH + 21


class OperateArgs:
    """The checks of the operator calls' arguments (Queue and AsyncQueue)."""

    name: str
    client: Any
    keys: Any

    def _jobs_args(self, state: str, cursor: str, limit: int, with_data: bool) -> list:
        if state not in LISTED:
            raise InvalidInput(f"state must be one of {', '.join(LISTED)}, not {state!r}")
        if not isinstance(cursor, str) or not cursor or len(cursor) > CURSOR_CHARS:
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

    def _refuse_schedule(self, chunks: list[list[str]], scheduled: bool) -> None:
        """InvalidInput, before anything is written, when the ids hold the occurrence of
        the queue's schedule (`scheduled`): the schedule makes its next occurrence itself,
        and a requeued one is a run of the periodic job more (queasy_requeue would block
        it behind the occurrence running, then run it)."""
        if scheduled and any(SCHEDULE_ID in chunk for chunk in chunks):
            raise InvalidInput(self._schedule_reason() + ": not requeued (no job was)")

    def _schedule_reason(self) -> str:
        return (
            f"job {SCHEDULE_ID!r} of {self.name} is an occurrence of the queue's schedule, "
            "which makes the next one itself: requeued, it would run the periodic job once more"
        )

    def _on_queue_node(self) -> dict[str, Any]:
        """The arguments that send a keyless command (TIME) to the queue's own server: on a
        cluster the primary of its slot (whose clock scored its failed records; redis-py
        would ask its default node, which may be down, or its clock another), else none."""
        r = self.client.redis
        if not self.client.cluster:
            return {}
        return {"target_nodes": r.get_node_from_key(self.keys.base)}

    @staticmethod
    def _others(ids: list, limit: int) -> list[str]:
        """Up to `limit` of these failed ids (a ZRANGE of B:failed) but the schedule's."""
        return [i for i in map(fields.text, ids) if i != SCHEDULE_ID][:limit]

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

    def _check_open(self, job_id: str, closes: int, exc: BaseException | None = None) -> None:
        """ClientClosed when the client was closed since result() began (`closes`: its
        Client.closes then): its connections were closed under the wait (`exc`: what that
        made the wait raise), or would be opened again by the next look."""
        if self.client.closes != closes:
            raise ClientClosed(
                f"the client was closed while result() waited for job {job_id} of {self.name}"
            ) from exc

    def _left(self, job_id: str, deadline: float | None, timeout: Any) -> float:
        """Seconds to wait before looking at the job (and the registry) again: RESULT_RECHECK
        at most; ResultTimeout when none is left."""
        recheck = defaults.RESULT_RECHECK
        left = recheck if deadline is None else deadline - time.monotonic()
        if left <= 0:
            raise self._timed_out(job_id, timeout)
        return min(left, recheck)


class Operate:
    """Queue's operator calls (a mixin: `client` and `keys` are the Queue's)."""

    client: Any
    keys: Any
    name: str
    get_job: Any
    _jobs_args: Any
    _requeue_chunks: Any
    _purged: Any
    _deadline: Any
    _timed_out: Any
    _left: Any
    _check_open: Any
    _refuse_schedule: Any
    _schedule_reason: Any
    _others: Any
    schedule_info: Any

    @as_connection_failed
    def reset_totals(self) -> None:
        """Start the finished and failed totals (and their per-minute counts) from 0."""
        if self.client.cluster:
            self.client.redis.delete(self.keys.stats)
        else:  # sent once (store/calls.py)
            self.client.fastcall.command("DEL", self.keys.stats)

    @as_connection_failed
    def jobs(
        self, state: str, cursor: str = "0", limit: int = 100, with_data: bool = False
    ) -> tuple[list[JobInfo], str]:
        """One page of the jobs in `state` (waiting, delayed, blocked, active, finished,
        failed, cancelled) and the cursor of the next page ("0" after the last): pass it
        back for the next. Each call is bounded (`limit` <= 1000); waiting and delayed come
        by run_at, ended ones newest first. `data` is None unless `with_data`."""
        args = self._jobs_args(state, cursor, limit, with_data)
        try:
            reply = self.client.redis.fcall_ro("queasy_jobs", 1, self.keys.base, *args)
        except redis.ResponseError as exc:
            raise lua_error(exc) from None  # a cursor not of this listing: InvalidInput
        return records.page(self.name, reply)

    @as_connection_failed
    def requeue_failed(self, ids: Iterable[str] | None = None) -> int:
        """Dispatch failed jobs (their kept records) again, to run now with counts 0: those
        with these ids, or every one that had failed when this was called. Their records
        go; returns how many were requeued."""
        total = 0
        if ids is not None:
            chunks = self._requeue_chunks(ids)
            if any(SCHEDULE_ID in chunk for chunk in chunks):
                self._refuse_schedule(chunks, self.schedule_info() is not None)
            for chunk in chunks:
                total += self._call("queasy_requeue", ["", "", PAGE, *chunk])[0]
            return total
        if self.schedule_info() is not None:  # not a look for its failed occurrence: one
            return self._requeue_but_schedule()  # failing right after it would be requeued
        cutoff = ""
        while True:
            done, cutoff, seen = self._call("queasy_requeue", ["", cutoff, PAGE])
            total += done
            if seen < PAGE:
                return total

    def _requeue_but_schedule(self) -> int:
        """requeue_failed() of every failed job but the occurrence of the queue's schedule
        (logged when there is one: _schedule_reason), by id, those that had failed when it
        was called."""
        r, total = self.client.redis, 0
        if r.zscore(self.keys.failed, SCHEDULE_ID) is not None:
            log.warning("%s: skipped", self._schedule_reason())
        seconds, micros = r.time(**self._on_queue_node())
        cutoff = seconds * 1000 + micros // 1000
        while True:
            page = r.zrange(self.keys.failed, "-inf", cutoff, byscore=True, offset=0, num=PAGE + 1)
            ids = self._others(page, PAGE)
            if ids:
                total += self._call("queasy_requeue", ["", "", PAGE, *ids])[0]
            if len(ids) < PAGE:
                return total

    @as_connection_failed
    def purge(self, state: str) -> int:
        """Remove the jobs in `state` (waiting, delayed, blocked, finished, failed, cancelled,
        or all of those); never an active job. Returns how many were removed. No event is
        written for them."""
        total = 0
        for name in self._purged(state):
            bound = None
            while True:
                # (a library before 4.3.0, loaded back by hand, replies without `dropped`)
                removed, left, *dropped = self._call("queasy_purge", ["", name, PAGE, "1"])
                total += dropped[0] if dropped else removed
                bound = removed + left if bound is None else bound - removed
                if removed < PAGE or bound <= 0:
                    break
        return total

    @as_connection_failed
    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """Wait for job `job_id` to end and return its handler's return value (None if its
        queue does not store results). JobFailed when it failed for good or was cancelled,
        JobNotFound for an unknown id, ResultTimeout after `timeout` seconds. The waiter is
        woken by the end itself: a message on the job's channel where every live supervisor
        of the queue stores results (they publish ends), else the job's outcome event; it
        looks at the job and the registry again every RESULT_RECHECK seconds, choosing again,
        so an end that woke nothing is seen then (README "Results")."""
        validate.job_id(job_id)
        deadline, closes = self._deadline(timeout), self.client.closes
        with ResultWake(self.client.redis, self.keys, job_id) as wake:
            try:
                while True:  # the wake-up is chosen before the look: an end after it wakes it
                    self._check_open(job_id, closes)
                    supervisors = self.client.supervisors()
                    wake.choose(records.publishes_ends(supervisors, self.name))
                    results = records.stores_results(supervisors, self.name)
                    info = self.get_job(job_id)
                    ended, watched = wake.look(info)
                    if watched is not None:  # it ended, and its id is live again
                        page, _ = self.jobs(ended["outcome"], limit=records.ENDS_LOOKED_AT)
                        info = records.ended_run(page, job_id, watched)
                    done, value = records.outcome(info, job_id, self.name, ended, results)
                    if done:
                        return value
                    wake.wait(self._left(job_id, deadline, timeout))
            except QueasyError as exc:
                if type(exc) is ConnectionFailed:  # get_job's, say: of a close() too?
                    self._check_open(job_id, closes, exc.__cause__)
                raise
            except Exception as exc:  # a connection closed under it by close(): ClientClosed
                self._check_open(job_id, closes, exc)
                raise

    @as_connection_failed
    def events(self, after: str = "0", count: int = 100) -> list[dict[str, Any]]:
        """Up to `count` outcome events after event id `after` ("0": the oldest kept),
        oldest first; each event's `event_id` is the `after` of the next read (README
        "Outcome events")."""
        return events.page(self.client.redis, self.keys.events, after, count)

    def _call(self, name: str, args: list) -> Any:
        """FCALL `name` (a write) on this queue. On one server sent once (store/calls.py:
        never again after a lost reply)."""
        try:
            if not self.client.cluster:
                return self.client.fastcall(name, [self.keys.base], args)
            return fcall(self.client.redis, name, [self.keys.base], args)
        except redis.ResponseError as exc:
            raise lua_error(exc) from None
