"""The async twin of the producer API: AsyncClient and AsyncQueue, same names, awaitable.

    async with AsyncClient(url) as client:
        q = client.queue("emails")
        job_id = await q.dispatch({"to": "a@example.com"})
        print(await q.get_job(job_id), await q.counts())

AsyncQueue has Queue's producer methods (dispatch, dispatch_many, dispatch_batch, cancel,
get_job, counts) and fail_queue; running handlers (listen/run) stays with the synchronous Client.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import redis

from . import defaults, records, validate
from .connfailed import as_connection_failed
from .defaults import SCHEDULE_ID
from .errors import ConnectionFailed, InvalidInput, QueasyError
from .job import JobInfo, ScheduleInfo
from .operate import PAGE
from .queue_base import BatchResult, QueueBase
from .resolve import PathLike, Target, resolve
from .store import events
from .store.aiocalls import AsyncWrites
from .store.aioconn import async_connection, ready_connection, time_and_hash
from .store.connection import is_cluster_url
from .store.keys import RegistryKeys
from .store.library import Dispatched, lua_error
from .store.reload import fcall_pipelined_async
from .waits import AsyncResultWake, CancelSeen

log = logging.getLogger("queasy_py")


class AsyncClient:
    """Like Client (url None: $QUEASY_REDIS_URL, else the project config's `redis`, else the
    project's embedded server: queasy_py/resolve.py), for asyncio; on a `redis+cluster://`
    URL too (store/aiocluster.py)."""

    def __init__(
        self,
        url: str | Target | None = None,
        *,
        prefix: str = defaults.PREFIX,
        max_payload: int = defaults.MAX_PAYLOAD_BYTES,
        config: PathLike | None = None,
        data_dir: PathLike | None = None,
    ) -> None:
        self.prefix = validate.key_prefix(prefix)
        self.max_payload = validate.payload_limit(max_payload)
        target = url if isinstance(url, Target) else resolve(url, config=config, data_dir=data_dir)
        self.server = target.server
        self.url = target.url
        self.cluster = is_cluster_url(self.url)
        #: the writes on one server, sent once (store/aiocalls.py); None on a cluster
        self.writes: AsyncWrites | None
        self.redis, self.writes = async_connection(self.url, self.server)  # store/aioconn.py
        # INFO when the URL was found (env, config, the embedded server), not given
        log.log(logging.DEBUG if target.explicit else logging.INFO, "using %s", target.describe())
        self.library_version: str | None = None
        self._queues: dict[str, AsyncQueue] = {}
        self.closes = 0  # Client.closes
        #: the waits of result() under way (tasks of their own): close() ends them first
        self._waits: set[asyncio.Task] = set()

    @as_connection_failed
    async def ready(self) -> AsyncClient:
        """Connect and load the function library (done by the first call if not before)."""
        if self.library_version is not None:
            return self
        # on a cluster on every primary; ConnectionFailed naming the URL (store/aioconn.py)
        self.library_version = await ready_connection(self.redis, self.url)
        return self

    def queue(self, name: str) -> AsyncQueue:
        """The queue called `name` (1-100 chars of A-Z a-z 0-9 _ . : -)."""
        return self._queue(name, None)

    def _queue(self, name: str, tag: str | None) -> AsyncQueue:
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = AsyncQueue(self, name, tag)
        elif tag is not None and queue.keys.tag != tag:
            raise InvalidInput(
                f"queue {name!r} is already in use with hash tag {queue.keys.tag!r}; "
                f"it cannot also be the fail queue of {tag!r}"
            )
        return queue

    async def close(self) -> None:
        """Close the connections; a result() waiting on this client ends with ClientClosed.
        Its wait is cancelled, and ended (bounded: defaults.SOCKET_TIMEOUT), before the
        connections close: closed under a wait, redis-py's retry would open its connection
        again while the pool closed it, and the two could leave a socket to the collector."""
        self.closes += 1  # Client.closes
        waits = [wait for wait in self._waits if not wait.done()]
        for wait in waits:
            wait.cancel()
        if waits:
            await asyncio.wait(waits, timeout=defaults.SOCKET_TIMEOUT)
        await self.redis.aclose()
        if self.server is not None:
            self.server.close()  # stops it if no other process uses it: a short wait
            self.server = None

    async def __aenter__(self) -> AsyncClient:
        """Connects (ready()); closed again when that fails (no __aexit__ runs then)."""
        try:
            return await self.ready()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _retrieved(task: asyncio.Future) -> None:
    """Take the outcome of a wait its caller no longer awaits (no 'never retrieved' log)."""
    if not task.cancelled():
        task.exception()


class AsyncQueue(QueueBase):
    """A named queue of an AsyncClient: Queue's producer methods, awaitable."""

    client: AsyncClient

    @property
    def fail_queue(self) -> AsyncQueue:
        """The queue of this queue's fail jobs (same hash tag, name + '-fail'), as Queue's."""
        return self.client._queue(self.name + defaults.FAIL_QUEUE_SUFFIX, self.keys.tag)

    async def _fcall(self, name: str, args: list) -> Any:
        """FCALL `name` (a write) on this queue. On one server sent once
        (store/aiocalls.py: never again after a lost reply)."""
        await self.client.ready()
        try:
            if self.client.writes is not None:
                return await self.client.writes(name, [self.keys.base], args)
            return await self.client.redis.fcall(name, 1, self.keys.base, *args)
        except redis.ResponseError as exc:
            raise lua_error(exc) from None

    async def _register(self) -> None:
        if self._wants_register():
            await self.client.ready()
            try:
                await self.client.redis.sadd(RegistryKeys(self.client.prefix).queues, self.name)
            except redis.exceptions.NoPermissionError as exc:
                raise lua_error(exc) from None  # a key outside the user's ~PREFIX:*
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._unregistered(exc)  # a cluster's registry primary down (Queue._register)
                return
            self.registered = True

    @as_connection_failed
    async def dispatch(
        self,
        data: Any,
        id: str | None = None,
        run_at: Any = None,
        delay: float | None = None,
        update_data: bool = True,
        update_run_at: bool | str = True,
        reset_counts: bool | None = None,
    ) -> str:
        args = self._dispatch_args(
            data, id, run_at, delay, update_data, update_run_at, reset_counts
        )
        await self._register()
        await self._fcall("queasy_dispatch", args)
        return args[5]

    @as_connection_failed
    async def dispatch_many(
        self,
        jobs: Iterable[Mapping[str, Any]],
        update_data: bool = True,
        update_run_at: bool | str = True,
        reset_counts: bool | None = None,
    ) -> list[str]:
        chunks, ids = self._dispatch_many_args(jobs, update_data, update_run_at, reset_counts)
        await self._check_reserved(ids, chunks)
        await self._pipelined("queasy_dispatch", chunks)
        return ids

    @as_connection_failed
    async def dispatch_batch(
        self,
        jobs: Iterable[Mapping[str, Any]],
        update_data: bool = True,
        update_run_at: bool | str = True,
        reset_counts: bool | None = None,
        *,
        dedup_window: float | None = None,
    ) -> BatchResult:
        """Queue.dispatch_batch, awaitable: what happened to each job (dedup_window too)."""
        window = None if dedup_window is None else self._window_ms(dedup_window)
        chunks, ids = self._dispatch_many_args(jobs, update_data, update_run_at, reset_counts)
        await self._check_reserved(ids, chunks)
        replies = await self._pipelined(*self._batch_calls(chunks, window))
        return BatchResult(ids, [Dispatched(int(code)) for reply in replies for code in reply])

    async def _check_reserved(self, ids: list[str], chunks: list[list]) -> None:
        index = self._reserved_at(ids, chunks)
        if index is not None:
            self._refuse_reserved(index, await self.schedule_info())

    async def _pipelined(self, name: str, chunks: list[list]) -> list:
        """FCALL `name` once per chunk of arguments, pipelined in one round trip (the queue
        registered first); their replies. On one server sent once (_fcall)."""
        if not chunks:
            return []
        await self._register()
        try:
            if self.client.writes is not None:  # one server: sent once (store/aiocalls.py)
                return await self.client.writes.pipelined(name, [self.keys.base], chunks)
            return await fcall_pipelined_async(self.client.redis, name, self.keys.base, chunks)
        except redis.ResponseError as exc:
            raise self._refused(exc, chunks) from None

    @as_connection_failed
    async def cancel(self, job_id: str) -> bool:
        return bool(await self._fcall("queasy_cancel", self._cancel_args(job_id)))

    @as_connection_failed
    async def get_job(self, job_id: str) -> JobInfo | None:
        validate.job_id(job_id)
        await self.client.ready()
        row = await self.client.redis.fcall_ro("queasy_get_job", 1, self.keys.base, "", job_id)
        return self._job_info(row)

    @as_connection_failed
    async def schedule_info(self) -> ScheduleInfo | None:
        await self.client.ready()
        row = await self.client.redis.fcall_ro("queasy_schedule_info", 1, self.keys.base, "")
        return self._schedule_info(row)

    @as_connection_failed
    async def drop_schedule(self) -> bool:
        """Queue.drop_schedule."""
        for cancelled in (False, True):
            dropped = self._unscheduled(await self._fcall("queasy_unschedule", [""]), cancelled)
            if dropped is not None:
                return dropped
            await self.cancel(SCHEDULE_ID)
        raise AssertionError("unreachable: the second reply decides")

    @as_connection_failed
    async def counts(self) -> dict[str, int]:
        await self.client.ready()
        return self._counts(
            await self.client.redis.fcall_ro("queasy_counts", 1, self.keys.base, "")
        )

    @as_connection_failed
    async def reset_totals(self) -> None:
        await self.client.ready()
        if self.client.writes is not None:  # sent once (_fcall)
            await self.client.writes.command("DEL", self.keys.stats)
        else:
            await self.client.redis.delete(self.keys.stats)

    @as_connection_failed
    async def jobs(
        self, state: str, cursor: str = "0", limit: int = 100, with_data: bool = False
    ) -> tuple[list[JobInfo], str]:
        args = self._jobs_args(state, cursor, limit, with_data)
        await self.client.ready()
        try:
            reply = await self.client.redis.fcall_ro("queasy_jobs", 1, self.keys.base, *args)
        except redis.ResponseError as exc:
            raise lua_error(exc) from None  # a cursor not of this listing: InvalidInput
        return records.page(self.name, reply)

    @as_connection_failed
    async def requeue_failed(self, ids: Iterable[str] | None = None) -> int:
        total = 0
        if ids is not None:
            chunks = self._requeue_chunks(ids)
            if any(SCHEDULE_ID in chunk for chunk in chunks):
                self._refuse_schedule(chunks, await self.schedule_info() is not None)
            for chunk in chunks:
                total += (await self._fcall("queasy_requeue", ["", "", PAGE, *chunk]))[0]
            return total
        if await self.schedule_info() is not None:  # Queue.requeue_failed
            return await self._requeue_but_schedule()
        cutoff = ""
        while True:
            done, cutoff, seen = await self._fcall("queasy_requeue", ["", cutoff, PAGE])
            total += done
            if seen < PAGE:
                return total

    async def _requeue_but_schedule(self) -> int:
        """Queue._requeue_but_schedule."""
        r, total = self.client.redis, 0
        if await r.zscore(self.keys.failed, SCHEDULE_ID) is not None:
            log.warning("%s: skipped", self._schedule_reason())
        seconds, micros = await r.time(**self._on_queue_node())
        cutoff = seconds * 1000 + micros // 1000
        while True:
            page = await r.zrange(
                self.keys.failed, "-inf", cutoff, byscore=True, offset=0, num=PAGE + 1
            )
            ids = self._others(page, PAGE)
            if ids:
                total += (await self._fcall("queasy_requeue", ["", "", PAGE, *ids]))[0]
            if len(ids) < PAGE:
                return total

    @as_connection_failed
    async def purge(self, state: str) -> int:
        total = 0
        for name in self._purged(state):
            bound = None
            while True:
                # (a library before 4.3.0, loaded back by hand, replies without `dropped`)
                removed, left, *dropped = await self._fcall("queasy_purge", ["", name, PAGE, "1"])
                total += dropped[0] if dropped else removed
                bound = removed + left if bound is None else bound - removed
                if removed < PAGE or bound <= 0:
                    break
        return total

    @as_connection_failed
    async def result(self, job_id: str, timeout: float | None = None) -> Any:
        """Like Queue.result: woken by the job's end (its channel, or its outcome event),
        looking at the job and the registry again every RESULT_RECHECK seconds."""
        validate.job_id(job_id)
        deadline = self._deadline(timeout)
        cancel = CancelSeen()
        await self.client.ready()
        cancel.check()
        # the wait runs in a task of its own: a cancel of this one ends it at once, whatever
        # the redis-py call under way does with the cancel passed on to it (CancelSeen)
        closes = self.client.closes
        waiter = asyncio.ensure_future(self._wait(job_id, deadline, timeout, closes))
        self.client._waits.add(waiter)
        waiter.add_done_callback(self.client._waits.discard)
        try:
            return await asyncio.shield(waiter)
        except asyncio.CancelledError:
            if waiter.cancelled() and not cancel.seen():  # ended by close(), not by a cancel
                self._check_open(job_id, closes)
            waiter.cancel()  # it stops at its next check, closing its subscription
            waiter.add_done_callback(_retrieved)
            raise

    async def _wait(
        self, job_id: str, deadline: float | None, timeout: float | None, closes: int
    ) -> Any:
        """result()'s wait, in a task of its own (`closes`: the client's closes at its start:
        Queue.result)."""
        cancel = CancelSeen()
        async with AsyncResultWake(self.client.redis, self.keys, job_id) as wake:
            try:
                while True:  # the wake-up is chosen before the look: an end after it wakes it
                    self._check_open(job_id, closes)
                    by_channel, results = await self._publishes_ends()
                    await wake.choose(by_channel)
                    info = await self.get_job(job_id)
                    ended, watched = wake.look(info)
                    if watched is not None:  # it ended, and its id is live again
                        page, _ = await self.jobs(ended["outcome"], limit=records.ENDS_LOOKED_AT)
                        info = records.ended_run(page, job_id, watched)
                    done, value = records.outcome(info, job_id, self.name, ended, results)
                    cancel.check()
                    if done:
                        return value
                    await wake.wait(self._left(job_id, deadline, timeout))
                    cancel.check()
            except QueasyError as exc:
                if type(exc) is ConnectionFailed:  # get_job's, say: of a close() too?
                    self._check_open(job_id, closes, exc.__cause__)
                raise
            except Exception as exc:  # a connection closed under it by close(): ClientClosed
                self._check_open(job_id, closes, exc)
                raise

    async def _publishes_ends(self) -> tuple[bool, bool]:
        """Whether the ends of this queue's jobs are published on their channels now
        (records.publishes_ends over the registry's live supervisors), and whether one of
        them stores results (records.stores_results)."""
        key = RegistryKeys(self.client.prefix).supervisors
        now, entries = await time_and_hash(self.client.redis, key, self.client.cluster)
        supervisors = records.live(entries.values(), now)
        return (
            records.publishes_ends(supervisors, self.name),
            records.stores_results(supervisors, self.name),
        )

    @as_connection_failed
    async def events(self, after: str = "0", count: int = 100) -> list[dict[str, Any]]:
        low, high, count = events.range_args(self.keys.events, after, count)
        await self.client.ready()
        entries = await self.client.redis.xrange(self.keys.events, low, high, count=count)
        return events.parse_entries(entries, self.keys.events)
