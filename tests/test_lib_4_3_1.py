"""The defect library 4.3.1 fixes: a failed occurrence of a queue's schedule (job id
`schedule`) is never requeued while the queue has a schedule, in the same step as the requeue.
queasy_py checked it in Python only, so a schedule made between that look and the FCALL of
queasy_requeue let the occurrence through: a copy blocked behind the running occurrence, a
run of the periodic job more. Raw FCALL and the public API against a real server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from lua_calls import NOW, SCHEDULE_ID, Lua, schedule, snapshot

from queasy_py import InvalidInput, Queue
from queasy_py.aio import AsyncClient, AsyncQueue
from queasy_py.store.library import Ack

REFUSED = f"id '{SCHEDULE_ID}' is the occurrence of this queue's schedule"


def failed(lua: Lua, *ids: str) -> None:
    for id in ids:
        assert lua.fail("c1", lua.take(id)) == Ack.OK


def scheduled_and_running(lua: Lua) -> None:
    """The queue gets a schedule and its occurrence starts (active)."""
    assert schedule(lua, None, NOW).code == 2
    assert lua.dequeue("c2", limit=1).ids == [SCHEDULE_ID]


def test_requeue_of_the_occurrence_by_id_is_refused_whole(
    lua: Lua, r: redis.Redis, prefix: str
) -> None:
    failed(lua, "a", SCHEDULE_ID)
    scheduled_and_running(lua)
    before = snapshot(r, prefix)
    with pytest.raises(redis.ResponseError, match=f"INVALID {REFUSED}"):
        lua.requeue("a", SCHEDULE_ID)
    assert snapshot(r, prefix) == before  # nothing written, not even a's


def test_requeue_without_ids_passes_over_the_occurrence(lua: Lua) -> None:
    failed(lua, "a", SCHEDULE_ID, "b")
    scheduled_and_running(lua)
    done, _, seen = lua.requeue(limit=2)  # the oldest 2 but the occurrence: a and b
    assert (done, seen) == (2, 2)
    assert lua.requeue(limit=2)[::2] == [0, 0]  # none left: the caller's loop ends
    assert lua.requeue(limit=1)[::2] == [0, 0]  # even a page of one (the record stays)
    assert lua.counts()["blocked"] == 0
    assert lua.record(SCHEDULE_ID)["state"] == "active"
    assert lua.r.zscore(f"{lua.B}:failed", SCHEDULE_ID) is not None  # its record kept


def test_without_a_schedule_the_id_is_requeued_as_any(lua: Lua) -> None:
    failed(lua, SCHEDULE_ID)
    assert lua.requeue(SCHEDULE_ID)[0] == 1
    assert lua.counts()["waiting"] == 1


def scheduled_after_the_look(queue: Any, lua: Lua) -> None:
    """Make the queue's schedule (its occurrence running) right after requeue_failed's own
    look for one: the window between that check and the FCALL."""
    look = queue.schedule_info

    def schedule_info() -> Any:
        info = look()
        scheduled_and_running(lua)
        return info

    async def aschedule_info() -> Any:
        info = await look()
        scheduled_and_running(lua)
        return info

    is_async = isinstance(queue, AsyncQueue)
    queue.schedule_info = aschedule_info if is_async else schedule_info


@pytest.mark.parametrize("ids", [None, [SCHEDULE_ID]])
def test_a_schedule_made_after_requeue_failed_looked_still_stops_it(
    lua: Lua, q: Queue, ids: list[str] | None
) -> None:
    failed(lua, SCHEDULE_ID)
    scheduled_after_the_look(q, lua)
    if ids is None:
        assert q.requeue_failed() == 0
    else:
        with pytest.raises(InvalidInput, match=REFUSED):
            q.requeue_failed(ids)
    assert lua.counts()["blocked"] == 0  # no copy runs the periodic job once more


def test_the_async_queue_is_stopped_alike(lua: Lua, redis_url: str, prefix: str) -> None:
    failed(lua, SCHEDULE_ID)

    async def scenario() -> None:
        async with AsyncClient(redis_url, prefix=prefix) as client:
            aq = client.queue("q")
            scheduled_after_the_look(aq, lua)
            with pytest.raises(InvalidInput, match=REFUSED):
                await aq.requeue_failed([SCHEDULE_ID])

    asyncio.run(scenario())
    assert lua.counts()["blocked"] == 0
