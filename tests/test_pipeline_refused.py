"""A chunk of a pipelined dispatch_many refused in the middle (the server's maxmemory reached
by the chunks before it): a pipeline is not one step, so the chunks before it were applied.
The error said only the server's words ('command not allowed when used memory >
maxmemory'), as if nothing was dispatched; it now says which jobs were, and the connection
stays in step (every reply read). Sync and async, on a server of this module's own."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest
import redis

from queasy_py import Client
from queasy_py.aio import AsyncClient
from queasy_py.queue_base import DISPATCH_CHUNK
from queasy_py.store.embedded import EmbeddedServer

#: the first chunk's jobs: ~1.5 MB that take the server past maxmemory (used + 100 kB): its
#: pipeline's query buffer, or the jobs of the chunk that ran
BIG = "x" * 3000
JOBS = [
    {"data": BIG if i < DISPATCH_CHUNK else 1, "id": f"j{i}"} for i in range(3 * DISPATCH_CHUNK)
]
SAID = re.compile(
    r"command not allowed when used memory > 'maxmemory'.* \((\d) of the 3 pipelined calls of "
    rf"up to {DISPATCH_CHUNK} jobs refused; (.+) of {len(JOBS)} were dispatched all the same, "
    r"the others were not\)$"
)


def said(exc: BaseException) -> set[str]:
    """The ids the error says were dispatched (some were: not every call was refused)."""
    found = SAID.search(str(exc))
    assert found is not None, str(exc)
    ids = set()
    for start, end in re.findall(r"jobs\[(\d+):(\d+)\]", found.group(2)):
        ids.update(f"j{i}" for i in range(int(start), int(end)))
    assert len(ids) == DISPATCH_CHUNK * (3 - int(found.group(1))), str(exc)
    return ids


@pytest.fixture(scope="module")
def own() -> Iterator[EmbeddedServer]:
    """A server of this module's own that takes CONFIG SET."""
    with EmbeddedServer(admin_commands=True) as server:
        yield server


@pytest.fixture
def full(own: EmbeddedServer) -> Iterator[redis.Redis]:
    """A raw connection to `own`; its maxmemory lifted and its data gone after the test."""
    with redis.Redis.from_url(own.url) as r:
        yield r
        r.config_set("maxmemory", 0)
        r.flushall()


def limit(r: redis.Redis) -> None:
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", int(r.info("memory")["used_memory"]) + 100_000)


def test_a_chunk_refused_in_the_middle_says_which_jobs_were_dispatched(
    own: EmbeddedServer, full: redis.Redis
) -> None:
    with Client(own.url, workers=0, prefix="qt-refused") as client:
        q = client.queue("q")
        q.dispatch(0, id="warm")
        limit(full)
        with pytest.raises(redis.ResponseError) as caught:
            q.dispatch_many(JOBS)
        dispatched = said(caught.value)
        full.config_set("maxmemory", 0)
        assert {job["id"] for job in JOBS if q.get_job(job["id"])} == dispatched
        assert q.cancel("nothing") is False  # the connection is in step
        assert q.dispatch(1, id="after") == "after"


def test_an_async_chunk_refused_in_the_middle_says_which_jobs_were_dispatched(
    own: EmbeddedServer, full: redis.Redis
) -> None:
    async def scenario() -> None:
        async with AsyncClient(own.url, prefix="qt-refused") as client:
            q = client.queue("q")
            await q.dispatch(0, id="warm")
            limit(full)
            with pytest.raises(redis.ResponseError) as caught:
                await q.dispatch_batch(JOBS)
            dispatched = said(caught.value)
            full.config_set("maxmemory", 0)
            assert (await q.counts())["waiting"] == 1 + len(dispatched)
            for job_id in dispatched:
                assert await q.get_job(job_id) is not None
            assert await q.cancel("nothing") is False
            assert await q.dispatch(1, id="after") == "after"

    asyncio.run(scenario())
