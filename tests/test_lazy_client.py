"""A Client connects on its first call, not when it is made (issue 10): a module-level client
imports while Redis is down; and AsyncQueue has Queue's fail_queue. Against real servers."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from queasy_py import Client, ConfigError, ConnectionFailed, InvalidInput, Queue
from queasy_py.aio import AsyncClient
from queasy_py.store.embedded import EmbeddedServer, free_port

ROOT = Path(__file__).resolve().parent.parent


def test_a_client_is_made_while_redis_is_down_and_its_first_call_connects(tmp_path) -> None:
    started = time.monotonic()
    client = Client("redis://127.0.0.1:1", workers=0)  # a module-level client in a web app
    assert time.monotonic() - started < 1.0  # no connection attempt, no retries
    assert client.library_version is None
    with pytest.raises(ConnectionFailed, match="cannot connect to Redis at redis://127.0.0.1:1"):
        client.queue("q").dispatch({"n": 1})
    client.close()


def test_a_lazy_client_works_once_the_server_is_up(tmp_path) -> None:
    port, password = free_port(), "qt-lazy-pw"
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    client = Client(url, workers=0, prefix="qt-lazy")
    try:
        with pytest.raises(ConnectionFailed, match=r"redis://:\*\*\*@127\.0\.0\.1"):
            client.queue("q").counts()
        with EmbeddedServer(port=port, password=password, data_dir=tmp_path / "data"):
            job_id = client.queue("q").dispatch({"n": 1})  # the next call connects
            info = client.queue("q").get_job(job_id)
            assert info is not None and info.state == "waiting" and info.data == {"n": 1}
            assert client.library_version is not None
    finally:
        client.close()


def test_a_bad_url_is_refused_when_the_client_is_made() -> None:
    with pytest.raises(ConfigError, match="invalid Redis URL"):
        Client("http://127.0.0.1:6379/0", workers=0)


@pytest.fixture(scope="module")
def empty_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer().start()
    try:
        yield server
    finally:
        server.stop()


FIRST_CALLS: dict[str, Callable[[Queue], Any]] = {
    "dispatch": lambda q: q.dispatch({"n": 1}),
    "dispatch_many": lambda q: q.dispatch_many([{"data": 1}, {"data": 2}]),
    "cancel": lambda q: q.cancel("nope"),
    "get_job": lambda q: q.get_job("nope"),
    "counts": lambda q: q.counts(),
    "redis": lambda q: q.client.redis.fcall_ro("queasy_counts", 1, q.keys.base, ""),
}


@pytest.mark.parametrize("first", list(FIRST_CALLS))
def test_any_first_call_loads_the_library(empty_server: EmbeddedServer, first: str) -> None:
    with redis.Redis.from_url(empty_server.url) as admin:
        admin.function_flush()
        with Client(empty_server.url, workers=0, prefix="qt-first") as client:
            pass  # `with` connects, as `async with AsyncClient(...)` does
        assert admin.function_list() != []
        admin.function_flush()
        client = Client(empty_server.url, workers=0, prefix="qt-first")
        try:
            assert admin.function_list() == []  # made: nothing sent
            FIRST_CALLS[first](client.queue("q"))
            assert admin.function_list() != []
        finally:
            client.close()
        admin.flushall()


# ---------------------------------------------------------------- AsyncQueue.fail_queue


def test_async_fail_queue_is_the_sync_fail_queue(redis_url: str, prefix: str) -> None:
    with Client(redis_url, workers=0, prefix=prefix) as client:
        sync_fail = client.queue("emails").fail_queue
        sync_fail.dispatch(["data", {"id": "j1", "queue": "emails"}, {}], id="f1")

        async def scenario() -> tuple:
            async with AsyncClient(redis_url, prefix=prefix) as aclient:
                fail = aclient.queue("emails").fail_queue
                assert fail is aclient.queue("emails").fail_queue
                info = await fail.get_job("f1")
                counts = await fail.counts()
                await fail.dispatch([1, {"id": "j2", "queue": "emails"}, {}], id="f2")
                cancelled = await fail.cancel("f1")
                return fail.name, fail.keys.base, info, counts, cancelled

        name, base, info, counts, cancelled = asyncio.run(scenario())
        assert (name, base) == ("emails-fail", sync_fail.keys.base)  # same hash tag: {emails}
        assert info is not None and info.data == ["data", {"id": "j1", "queue": "emails"}, {}]
        assert counts["waiting"] == 1
        assert cancelled is True
        assert sync_fail.get_job("f1").state == "cancelled"  # type: ignore[union-attr]
        f2 = sync_fail.get_job("f2")
        assert f2 is not None and f2.queue == "emails-fail" and f2.state == "waiting"


def test_async_fail_queue_refuses_a_queue_already_used_with_another_tag(
    redis_url: str, prefix: str
) -> None:
    aclient = AsyncClient(redis_url, prefix=prefix)
    aclient.queue("x-fail")  # its own hash tag {x-fail}
    with pytest.raises(InvalidInput, match="cannot also be the fail queue of 'x'"):
        _ = aclient.queue("x").fail_queue
    asyncio.run(aclient.close())


def test_a_client_and_its_queues_import_neither_redis_py_nor_asyncio() -> None:
    """`import queasy_py` stays light, and so does making a Client and its queues on a plain
    URL: redis-py (0.13-0.2 s, with asyncio) waits for the first call, and asyncio (about 30
    ms) for the asyncio API. waits.py, which queue.py imports for result(), imported asyncio
    at its top."""
    code = (
        "import sys\n"
        "from queasy_py import Client\n"
        "q = Client('redis://127.0.0.1:1', workers=0).queue('q')\n"
        "heavy = sorted(m for m in ('asyncio', 'redis') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
