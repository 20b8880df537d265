"""The async twin of the producer API against the real server."""

from __future__ import annotations

import asyncio

import pytest
from lua_calls import live

from queasy_py import Client, ConnectionFailed, InvalidInput
from queasy_py.aio import AsyncClient
from queasy_py.store.embedded import free_port


def run(coro):
    return asyncio.run(coro)


def test_async_dispatch_get_job_counts_cancel(redis_url: str, prefix: str) -> None:
    async def scenario() -> tuple:
        async with AsyncClient(redis_url, prefix=prefix) as client:
            q = client.queue("emails")
            first = await q.dispatch({"to": "a"})
            later = await q.dispatch({"to": "b"}, id="later", delay=60)
            many = await q.dispatch_many([{"data": n} for n in range(5)])
            info = await q.get_job(first)
            counts = await q.counts()
            cancelled = await q.cancel("later")
            gone = await q.get_job("later")
            return first, later, many, info, counts, cancelled, gone

    first, later, many, info, counts, cancelled, gone = run(scenario())
    assert later == "later" and len(many) == 5 and len(set(many)) == 5
    assert info.id == first and info.data == {"to": "a"} and info.state == "waiting"
    assert live(counts) == {"waiting": 6, "delayed": 1, "blocked": 0, "active": 0}
    assert cancelled is True and gone.state == "cancelled"  # its record is kept


def test_async_and_sync_clients_see_the_same_jobs(redis_url: str, prefix: str) -> None:
    async def dispatch() -> str:
        async with AsyncClient(redis_url, prefix=prefix) as client:
            return await client.queue("q").dispatch([1, 2], id="shared")

    assert run(dispatch()) == "shared"
    with Client(redis_url, prefix=prefix) as client:
        assert client.queue("q").get_job("shared").data == [1, 2]


def test_async_bad_input_is_rejected_before_sending(redis_url: str, prefix: str, r) -> None:
    async def scenario() -> None:
        async with AsyncClient(redis_url, prefix=prefix) as client:
            with pytest.raises(InvalidInput, match="give run_at or delay"):
                await client.queue("q").dispatch(1, run_at=1.0, delay=1.0)
            with pytest.raises(InvalidInput, match=r"jobs\[1\]"):
                await client.queue("q").dispatch_many([{"data": 1}, {"data": float("nan")}])

    run(scenario())
    assert list(r.scan_iter(f"{prefix}:*")) == []


@pytest.mark.parametrize("url", ["REDIS://:pw@h:1/0", "Rediss://h:1/0"])
def test_async_and_sync_refuse_an_upper_case_scheme_alike(url: str) -> None:
    """redis-py's sync client refuses REDIS://, its async one took it (a URL that worked
    with one client and not the other): both are a ConfigError now, the password masked."""
    from queasy_py.errors import ConfigError

    for make in (lambda: Client(url, workers=0), lambda: AsyncClient(url)):
        with pytest.raises(ConfigError, match="invalid Redis URL") as caught:
            make()
        assert "pw" not in str(caught.value)


def test_async_unreachable_server_names_the_url() -> None:
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"

    async def scenario() -> None:
        client = AsyncClient(url)
        try:
            await client.ready()
        finally:
            await client.close()

    with pytest.raises(ConnectionFailed) as caught:
        run(scenario())
    assert "127.0.0.1" in str(caught.value) and "secret" not in str(caught.value)


@pytest.mark.parametrize(
    "call",
    [
        lambda q: q.jobs("waiting", cursor="zzz"),
        lambda q: q.jobs("failed", cursor="-1"),
        lambda q: q.events(after="garbage"),
        lambda q: q.events(after="1-2-3"),
        lambda q: q.events(after="99999999999999999999999-0"),
        lambda q: q.events(after=None),
    ],
    ids=[
        "jobs_cursor",
        "jobs_negative_cursor",
        "events_after",
        "events_three_parts",
        "events_huge",
        "events_none",
    ],
)
def test_async_and_sync_refuse_a_bad_cursor_alike(redis_url: str, prefix: str, call) -> None:
    """A cursor or event id that is not one the API returned is InvalidInput on both
    clients (the async jobs() and both events() let redis-py's ResponseError through)."""

    async def scenario() -> str:
        async with AsyncClient(redis_url, prefix=prefix) as client:
            q = client.queue("q")
            await q.dispatch(1)
            with pytest.raises(InvalidInput) as caught:
                await call(q)
            return str(caught.value)

    message = run(scenario())
    with Client(redis_url, prefix=prefix) as client, pytest.raises(InvalidInput) as caught:
        call(client.queue("q"))
    assert str(caught.value) == message


def test_async_with_closes_the_client_when_ready_fails(raw, redis_url: str) -> None:
    """`async with AsyncClient(...)` whose ready() fails after connecting (here: the server
    holds a newer major library) left its connections open: __aexit__ never runs for a
    failed __aenter__. The sync Client closes itself then; so does this one now."""
    from test_lua import load_version

    from queasy_py.errors import VersionMismatch
    from queasy_py.store.library import bundled_version, parse_version

    load_version(raw, f"{parse_version(bundled_version())[0] + 1}.0.0")
    name = "aio-ready-fails"

    def connections() -> int:
        return sum(1 for c in raw.client_list() if c.get("name") == name)

    async def main() -> None:
        client = AsyncClient(f"{redis_url}?client_name={name}")
        with pytest.raises(VersionMismatch):
            async with client:
                pytest.fail("ready() should have refused the newer library")
        assert connections() == 0
        await client.close()

    asyncio.run(main())


def test_async_dispatch_batch_is_the_sync_ones_twin(redis_url: str, prefix: str) -> None:
    """The README's table: AsyncQueue has dispatch_batch, awaitable, with the same arguments
    (and dedup_window), and answers a BatchResult as Queue.dispatch_batch does."""

    async def scenario() -> tuple:
        async with AsyncClient(redis_url, prefix=prefix) as client:
            q = client.queue("imports")
            first = await q.dispatch_batch(
                [{"data": 1, "id": "a"}, {"data": 2, "id": "b"}], dedup_window=60.0
            )
            again = await q.dispatch_batch(
                [{"data": 1, "id": "a"}, {"data": 3, "id": "c"}], dedup_window=60.0
            )
            plain = await q.dispatch_batch([{"data": 4, "id": "c"}], update_data=False)
            with pytest.raises(InvalidInput, match="dedup_window"):
                await q.dispatch_batch([{"data": 5}], dedup_window=-1)
            return first, again, plain, await q.get_job("c"), await q.counts()

    first, again, plain, c, counts = run(scenario())
    with Client(redis_url, workers=0, prefix=prefix) as client:
        sync = client.queue("imports").dispatch_batch([{"data": 9, "id": "a"}])
    assert (first.ids, first.created, again.ids, again.updated, again.created) == (
        ["a", "b"], 2, ["a", "c"], 1, 1
    )  # fmt: skip
    assert type(first) is type(sync) and plain.updated == 1 and c.data == 3
    assert live(counts) == {"waiting": 3, "delayed": 0, "blocked": 0, "active": 0}


def test_more_concurrent_calls_than_redis_pys_default_pool_all_succeed(
    redis_url: str, prefix: str
) -> None:
    """150 coroutines on one AsyncClient at once (a web app's gather): each call gets a
    connection, as on a cluster URL. redis-py 6+ caps a pool at 100 connections and refuses
    the 101st at once (MaxConnectionsError: 'Too many connections', a ConnectionFailed
    'cannot connect to Redis' when it came during ready()): 50 calls failed."""

    async def scenario() -> tuple[list, list, dict]:
        async with AsyncClient(redis_url, prefix=prefix) as client:
            q = client.queue("q")
            later = await q.dispatch(1, delay=3600)
            waits = await asyncio.gather(
                *[q.result(later, timeout=0.5) for _ in range(150)], return_exceptions=True
            )
        fresh = AsyncClient(redis_url, prefix=prefix)  # not ready: 150 first calls at once
        try:
            ids = await asyncio.gather(
                *[fresh.queue("q").dispatch(n) for n in range(150)], return_exceptions=True
            )
            counts = await fresh.queue("q").counts()
        finally:
            await fresh.close()
        return waits, ids, counts

    waits, ids, counts = run(scenario())
    assert [type(e).__name__ for e in waits] == ["ResultTimeout"] * 150
    assert [e for e in ids if isinstance(e, BaseException)] == []
    assert live(counts) == {"waiting": 150, "delayed": 1, "blocked": 0, "active": 0}


def test_a_cancelled_result_stops_waiting_at_once(redis_url: str, prefix: str) -> None:
    """Cancelling an awaited result() (asyncio.wait_for, a web request gone) ends it at
    once with CancelledError. On Python 3.11 redis-py's calls may swallow a cancel that
    lands while they run (asyncio.wait_for of 3.11 returns the inner result instead): the
    waiter went on waiting, here until its timeout (ResultTimeout after 3 s), with
    timeout=None until the job ended. The connections it held go back to the pool."""

    async def scenario() -> list[str]:
        async with AsyncClient(redis_url, prefix=prefix) as client:
            q = client.queue("q")
            later = await q.dispatch(1, delay=3600)
            outcomes = []
            for pause in (0, 0, 0.0002, 0.0005, 0.001, 0.002, 0.01):
                task = asyncio.create_task(q.result(later, timeout=3))
                await asyncio.sleep(pause)
                task.cancel()
                started = asyncio.get_running_loop().time()
                try:
                    await task
                    outcomes.append("returned")
                except asyncio.CancelledError:
                    late = asyncio.get_running_loop().time() - started > 1.0
                    outcomes.append("late" if late else "cancelled")
                except Exception as exc:
                    outcomes.append(type(exc).__name__)
            pool = client.redis.connection_pool
            for _ in range(300):  # a cancelled wait gives its connection back (its next check)
                if not pool._in_use_connections:
                    break
                await asyncio.sleep(0.01)
            assert len(pool._in_use_connections) == 0
            assert (await q.get_job(later)).state == "delayed"  # the connection is in step
            return outcomes

    assert run(scenario()) == ["cancelled"] * 7
