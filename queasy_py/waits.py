"""What wakes a result() waiter (Queue.result, AsyncQueue.result): the job's end channel
`<base>:done:<id>`, which the library SPUBLISHes only when the supervisor that ends the job
stores results, or the queue's outcome events, read on from their end and filtered by the
job's id. The waiter chooses again before each look at the job (records.publishes_ends over
the live supervisors of the registry): supervisors come and go during a wait (a rolling
deploy, a second supervisor). Each wait lasts defaults.RESULT_RECHECK at most, so an end that
woke nothing (run by a supervisor without store_results that started after the choice, or
on a queue with events off) is seen at the next look, never polled for more often.

A wake also keeps the end of the job it saw, and the job it waits for (`Ends.look`): the
job's record can be gone by the look that follows (keep_finished or keep_failed of count 0,
or trimmed by other ends meanwhile), or another job with its id can be live by then (a
blocked copy promoted, a schedule's next occurrence); the waiter then answers from the end
it saw (records.outcome), not with JobNotFound, nor by waiting for the next job."""

from __future__ import annotations

import time
from typing import Any

from .job import END_STATES, JobInfo
from .store import events, fields
from .store.keys import QueueKeys

#: the most events one XREAD of a waiter reads (those of other jobs are skipped)
READ = 1000


def end_of(job_id: str, new: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The last end (finished, failed, cancelled) of job `job_id` among these events."""
    ends = [e for e in new if e.get("id") == job_id and e.get("outcome") in END_STATES]
    return ends[-1] if ends else None


def end_message(message: Any) -> dict[str, Any] | None:
    """The end a message of the job's channel tells (the library SPUBLISHes the state), as
    {"outcome": state, "channel": True}; None for anything else."""
    if not isinstance(message, dict) or message.get("type") not in ("smessage", "message"):
        return None
    state = fields.text(message.get("data"))
    return {"outcome": state, "channel": True} if state in END_STATES else None


class Ends:
    """The end of the job a wake saw during its last wait (an event, or the channel's
    state), and the job it waits for (its live record at the last look), taken by each
    look."""

    ended: dict[str, Any] | None = None
    watched: JobInfo | None = None

    def look(self, info: JobInfo | None) -> tuple[dict[str, Any] | None, JobInfo | None]:
        """(the end seen since the last look, or None; the job it ended when another job
        with its id is live now, or None). The job a look finds live is the one waited for
        from then on; a live job dispatched since with the same id (a blocked copy promoted
        at the end, the next occurrence of a schedule, a job that dispatched itself again)
        has another `enqueued_at`, and an end seen before the look that finds it was the end
        of the job waited for. (A blocked copy cancelled while its id is active ends nothing
        that runs: the look finds the active job, the same one.)"""
        ended, self.ended, before = self.ended, None, self.watched
        if info is None or info.state in END_STATES:
            return ended, None
        self.watched = info
        if ended is not None and before is not None and info.enqueued_at != before.enqueued_at:
            return ended, before
        return ended, None


class ResultWake(Ends):
    """The wake-up of a synchronous waiter (a context manager: closes its subscription)."""

    def __init__(self, r: Any, keys: QueueKeys, job_id: str) -> None:
        self.r, self.keys, self.job_id = r, keys, job_id
        self._pubsub: Any = None  # subscribed to the job's channel: waits on it
        self._after: str | None = None  # else the events are read on after this id

    def choose(self, by_channel: bool) -> None:
        """Wait on the job's channel (by_channel) or on the outcome events from now on.
        Called before each look at the job: an end after the look wakes the next wait."""
        if by_channel and self._pubsub is None:
            self._pubsub = self.r.pubsub(ignore_subscribe_messages=True)
            self._pubsub.ssubscribe(self.keys.done(self.job_id))  # the library SPUBLISHes it
            self._after = None
        elif not by_channel and self._after is None:
            self._after = events.last_id(self.r, self.keys.events)
            self.close()

    def wait(self, seconds: float) -> None:
        """Until something of the job's end arrives, or `seconds` pass (RESULT_RECHECK at
        most: OperateArgs._left)."""
        if self._pubsub is not None:
            # a cluster's pub/sub reads the shard's node (redis-py's ClusterPubSub)
            get = getattr(self._pubsub, "get_sharded_message", self._pubsub.get_message)
            self.ended = end_message(get(timeout=seconds)) or self.ended
            return
        until = time.monotonic() + seconds
        while (block := until - time.monotonic()) > 0:  # until an event of this job
            key = self.keys.events
            new = events.follow(self.r, key, self._after, READ, events.read_block(self.r, block))
            if new:
                self._after = new[-1]["event_id"]
                self.ended = end_of(self.job_id, new) or self.ended
                if any(event.get("id") == self.job_id for event in new):
                    return

    def close(self) -> None:
        if self._pubsub is not None:
            self._pubsub.close()
            self._pubsub = None

    def __enter__(self) -> ResultWake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CancelSeen:
    """Whether the running task was cancelled since this was made, though no CancelledError
    came: on Python 3.11 a redis-py call may swallow a cancel that lands while it runs (3.11's
    asyncio.wait_for returns the inner result then), and a loop of calls (result()) would go
    on waiting. check() raises the CancelledError that was lost."""

    def __init__(self) -> None:
        import asyncio  # here: queue.py imports this module, and asyncio costs ~30 ms

        self.task = asyncio.current_task()
        self.asked = self.task.cancelling() if self.task is not None else 0

    def seen(self) -> bool:
        """Whether the task was asked to cancel since this was made."""
        return self.task is not None and self.task.cancelling() > self.asked

    def check(self) -> None:
        if self.seen():
            import asyncio

            raise asyncio.CancelledError


class AsyncResultWake(Ends):
    """ResultWake of an asyncio waiter (an async context manager)."""

    def __init__(self, r: Any, keys: QueueKeys, job_id: str) -> None:
        self.r, self.keys, self.job_id = r, keys, job_id
        self._pubsub: Any = None
        self._after: str | None = None
        self._cancel = CancelSeen()  # of the task that waits

    async def choose(self, by_channel: bool) -> None:
        """ResultWake.choose."""
        if by_channel and self._pubsub is None:
            self._pubsub = self.r.pubsub(ignore_subscribe_messages=True)
            await self._pubsub.ssubscribe(self.keys.done(self.job_id))
            self._after = None
        elif not by_channel and self._after is None:
            newest = await self.r.xrevrange(self.keys.events, "+", "-", count=1)
            self._after = events.newest_id(newest)
            await self.aclose()

    async def wait(self, seconds: float) -> None:
        """ResultWake.wait."""
        if self._pubsub is not None:
            # a cluster's pub/sub reads the shard's node (redis-py's asyncio ClusterPubSub)
            get = getattr(self._pubsub, "get_sharded_message", self._pubsub.get_message)
            self.ended = end_message(await get(timeout=seconds)) or self.ended
            return
        key, until = self.keys.events, time.monotonic() + seconds
        while (block := until - time.monotonic()) > 0:  # until an event of this job
            wait = max(1, int(events.read_block(self.r, block) * 1000))
            reply = await self.r.xread({key: self._after}, count=READ, block=wait)
            self._cancel.check()
            new = events.read_entries(reply, key)
            if new:
                self._after = new[-1]["event_id"]
                self.ended = end_of(self.job_id, new) or self.ended
                if any(event.get("id") == self.job_id for event in new):
                    return

    async def aclose(self) -> None:
        if self._pubsub is not None:
            await self._pubsub.aclose()
            self._pubsub = None

    async def __aenter__(self) -> AsyncResultWake:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
