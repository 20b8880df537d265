"""A server that goes away once the client had connected (stopped, killed, restarting, frozen):
every public call of Client, Queue, AsyncClient and AsyncQueue raises ConnectionFailed naming
the masked URL and the call (redis-py's error its __cause__), never redis-py's own
ConnectionError or TimeoutError, and the next call once the server is back works. Against a
real embedded server stopped and started again on the same port (socket), with its data."""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from queasy_py import Client, ConnectionFailed, InvalidInput, Queue, defaults
from queasy_py.aio import AsyncClient, AsyncQueue
from queasy_py.errors import JobFailed
from queasy_py.store.embedded import EmbeddedServer, free_port

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "qt-gone-pw-7f3a"
#: how long a call may take to give up on a stopped server (it is refused at once)
BOUND = 5.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """A durable server on a port of its own: stopped and started again, it keeps its data
    (the function library too) on the same port."""
    with EmbeddedServer(
        port=free_port(), password=PASSWORD, data_dir=tmp_path / "data", durable=True
    ) as started:
        yield started


def ended(call: Callable[[], Any]) -> Any:
    """result() of the job cancelled before the outage: JobFailed once it answers."""
    try:
        return call()
    except JobFailed:
        return "ended"


async def aended(call: Callable[[], Any]) -> Any:
    try:
        return await call()
    except JobFailed:
        return "ended"


#: every public call of Queue and Client that talks to Redis, on a queue with a waiting job
#: 'a' and a cancelled job 'c'
SYNC_CALLS: dict[str, Callable[[Queue], Any]] = {
    "Queue.dispatch": lambda q: q.dispatch({"n": 2}),
    "Queue.dispatch_many": lambda q: q.dispatch_many([{"data": 1}, {"data": 2}]),
    "Queue.dispatch_batch": lambda q: q.dispatch_batch([{"data": 1, "id": "b"}]),
    "Queue.cancel": lambda q: q.cancel("nope"),
    "Queue.get_job": lambda q: q.get_job("a"),
    "Queue.counts": lambda q: q.counts(),
    "Queue.schedule_info": lambda q: q.schedule_info(),
    "Queue.drop_schedule": lambda q: q.drop_schedule(),
    "Queue.reset_totals": lambda q: q.reset_totals(),
    "Queue.jobs": lambda q: q.jobs("waiting"),
    "Queue.requeue_failed": lambda q: q.requeue_failed(),
    "Queue.purge": lambda q: q.purge("delayed"),
    "Queue.result": lambda q: ended(lambda: q.result("c", timeout=5)),
    "Queue.events": lambda q: q.events(),
    "Client.queues": lambda q: q.client.queues(),
    "Client.supervisors": lambda q: q.client.supervisors(),
    "Client.schedules": lambda q: q.client.schedules(),
}

ASYNC_CALLS: dict[str, Callable[[AsyncQueue], Any]] = {
    "AsyncQueue.dispatch": lambda q: q.dispatch({"n": 2}),
    "AsyncQueue.dispatch_many": lambda q: q.dispatch_many([{"data": 1}, {"data": 2}]),
    "AsyncQueue.dispatch_batch": lambda q: q.dispatch_batch([{"data": 1, "id": "b"}]),
    "AsyncQueue.cancel": lambda q: q.cancel("nope"),
    "AsyncQueue.get_job": lambda q: q.get_job("a"),
    "AsyncQueue.counts": lambda q: q.counts(),
    "AsyncQueue.schedule_info": lambda q: q.schedule_info(),
    "AsyncQueue.drop_schedule": lambda q: q.drop_schedule(),
    "AsyncQueue.reset_totals": lambda q: q.reset_totals(),
    "AsyncQueue.jobs": lambda q: q.jobs("waiting"),
    "AsyncQueue.requeue_failed": lambda q: q.requeue_failed(),
    "AsyncQueue.purge": lambda q: q.purge("delayed"),
    "AsyncQueue.result": lambda q: aended(lambda: q.result("c", timeout=5)),
    "AsyncQueue.events": lambda q: q.events(),
}

#: public methods that need no server once connected (ready: connects once), or none at all
NOT_REACHING = {"queue", "close", "listen", "run", "stop"}


def assert_names_the_server(exc: ConnectionFailed, server: EmbeddedServer, call: str) -> None:
    text = str(exc)
    assert server.masked_url in text, text
    assert PASSWORD not in text and PASSWORD not in repr(exc), text
    assert text.startswith(call.split(".")[1] + "()"), text  # `dispatch() of queue 'q': `
    assert isinstance(exc.__cause__, redis.ConnectionError | redis.TimeoutError), exc.__cause__


@pytest.mark.parametrize("call", list(SYNC_CALLS))
def test_a_sync_call_to_a_stopped_server_is_connection_failed_and_the_next_one_works(
    server: EmbeddedServer, call: str
) -> None:
    with Client(server.url, workers=0, prefix="qt-gone") as client:
        q = client.queue("q")
        q.dispatch({"n": 1}, id="a")
        q.dispatch({"n": 1}, id="c")
        assert q.cancel("c")
        SYNC_CALLS[call](q)  # connected: the pool holds open connections
        server.stop()
        started = time.monotonic()
        with pytest.raises(ConnectionFailed) as caught:
            SYNC_CALLS[call](q)
        assert time.monotonic() - started < BOUND
        assert_names_the_server(caught.value, server, call)
        server.start()
        SYNC_CALLS[call](q)  # the next call connects again
        assert q.get_job("a") is not None  # the data survived: the same server


@pytest.mark.parametrize("call", list(ASYNC_CALLS))
def test_an_async_call_to_a_stopped_server_is_connection_failed_and_the_next_one_works(
    server: EmbeddedServer, call: str
) -> None:
    async def scenario() -> None:
        async with AsyncClient(server.url, prefix="qt-gone") as client:
            q = client.queue("q")
            await q.dispatch({"n": 1}, id="a")
            await q.dispatch({"n": 1}, id="c")
            assert await q.cancel("c")
            await ASYNC_CALLS[call](q)
            server.stop()
            started = time.monotonic()
            with pytest.raises(ConnectionFailed) as caught:
                await ASYNC_CALLS[call](q)
            assert time.monotonic() - started < BOUND
            assert_names_the_server(caught.value, server, call)
            server.start()
            await ASYNC_CALLS[call](q)
            assert await q.get_job("a") is not None

    asyncio.run(scenario())


#: the writes, sent once (store/calls.py, store/aiocalls.py)
WRITES = (
    "dispatch", "dispatch_many", "dispatch_batch", "cancel", "reset_totals", "purge",
    "drop_schedule",
)  # fmt: skip


@pytest.mark.parametrize("call", WRITES)
def test_an_async_write_after_a_restart_between_calls_works(
    server: EmbeddedServer, call: str
) -> None:
    """The server restarted between two calls: the pool's connection was closed by it.
    AsyncWrites sent the write on it all the same (redis-py 8's pool hands out a closed
    connection while its maintenance notifications are on, their default), so the first
    write after a restart failed with 'the server may have applied it', though nothing had
    been sent to the server that answers now (README: replaced at checkout)."""

    async def scenario() -> None:
        async with AsyncClient(server.url, prefix="qt-gone") as client:
            q = client.queue("q")
            await q.dispatch({"n": 1}, id="a")
            await asyncio.to_thread(server.stop)  # the loop runs meanwhile, as in an app:
            await asyncio.to_thread(server.start)  # it reads the connection's EOF
            await ASYNC_CALLS["AsyncQueue." + call](q)  # no ConnectionFailed
            assert await q.get_job("a") is not None

    asyncio.run(scenario())


@pytest.mark.parametrize("call", WRITES)
def test_an_async_write_after_the_server_closed_its_connection_is_sent_once_and_works(
    server: EmbeddedServer, call: str
) -> None:
    """The server closed the client's connections between two calls, and stays up (CLIENT
    KILL: an operator, a timeout, a proxy): the connection the write takes is found closed
    and replaced before anything is sent, so the write works, applied once: the pool's own
    check does it (store/aioconn.pool_checks; AsyncWrites' check of its own is gone)."""

    def kill() -> int:
        with redis.Redis.from_url(server.url) as admin:
            return int(admin.client_kill_filter(_type="normal", skipme=True))

    async def scenario() -> None:
        async with AsyncClient(server.url, prefix="qt-gone") as client:
            q = client.queue("q")
            await q.dispatch({"n": 1}, id="a")
            await q.dispatch({"n": 1}, id="c")
            assert await q.cancel("c")
            assert await asyncio.to_thread(kill) >= 1  # the loop reads the EOF meanwhile
            await ASYNC_CALLS["AsyncQueue." + call](q)  # no ConnectionFailed
            assert await q.get_job("a") is not None
            if call == "dispatch":  # sent once: one job more ('a' waited), not two
                assert (await q.counts())["waiting"] == 2

    asyncio.run(scenario())


#: the reads (redis-py's own commands, through its pool)
READS = ("get_job", "counts", "schedule_info", "jobs", "events")


@pytest.mark.parametrize("call", READS)
def test_an_async_read_after_a_restart_between_calls_works(
    server: EmbeddedServer, call: str
) -> None:
    """The same restart for the reads: redis-py 8's asyncio pool skips its check of the
    connection it hands out while maintenance notifications are on (their default 'auto'),
    so the first read after a restart failed with ConnectionFailed ('Connection closed by
    server'). AsyncClient turns them off (store/aioconn.pool_checks): the pool replaces it."""

    async def scenario() -> None:
        async with AsyncClient(server.url, prefix="qt-gone") as client:
            q = client.queue("q")
            await q.dispatch({"n": 1}, id="a")
            await asyncio.to_thread(server.stop)
            await asyncio.to_thread(server.start)
            await ASYNC_CALLS["AsyncQueue." + call](q)  # no ConnectionFailed
            assert await q.get_job("a") is not None

    asyncio.run(scenario())


@pytest.mark.parametrize("call", WRITES)
def test_a_sync_write_after_a_restart_between_calls_works(
    server: EmbeddedServer, call: str
) -> None:
    with Client(server.url, workers=0, prefix="qt-gone") as client:
        q = client.queue("q")
        q.dispatch({"n": 1}, id="a")
        q.counts()  # a connection of redis-py's in the pool too
        server.stop()
        server.start()
        SYNC_CALLS["Queue." + call](q)
        assert q.get_job("a") is not None


def test_every_public_call_that_reaches_redis_is_covered() -> None:
    """A public method added without @as_connection_failed (or without a row above) fails here."""
    for cls, calls in ((Client, SYNC_CALLS), (Queue, SYNC_CALLS), (AsyncQueue, ASYNC_CALLS)):
        for name, member in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_") or name in NOT_REACHING or name == "ready":
                continue
            assert hasattr(member, "__wrapped__"), f"{cls.__name__}.{name}: no decorator"
            assert f"{cls.__name__}.{name}" in calls, f"{cls.__name__}.{name} is not tested"
    for cls in (Client, AsyncClient):
        assert hasattr(cls.ready, "__wrapped__")  # a server lost while the library loads


def test_a_unix_socket_server_stopped_and_started_again() -> None:
    where = tempfile.mkdtemp(prefix="qt-gone-")  # short: a socket path has 107 bytes at most
    sock = os.path.join(where, "s.sock")
    server = EmbeddedServer(
        unix_socket=sock, password=PASSWORD, data_dir=os.path.join(where, "d"), durable=True
    ).start()
    try:
        with Client(server.url, workers=0, prefix="qt-gone") as client:
            q = client.queue("q")
            q.dispatch({"n": 1}, id="a")
            server.stop()
            with pytest.raises(ConnectionFailed) as caught:
                q.dispatch({"n": 2})
            assert_names_the_server(caught.value, server, "Queue.dispatch")
            assert sock in str(caught.value)  # unix://:***@/path: where it was looked for
            server.start()
            assert q.get_job("a") is not None and q.dispatch({"n": 3})
    finally:
        server.stop()
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(defaults, "SOCKET_TIMEOUT", 1.0, raising=False)


@contextmanager
def frozen(server: EmbeddedServer) -> Iterator[None]:
    os.kill(server.pid, signal.SIGSTOP)  # type: ignore[arg-type]
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)  # type: ignore[arg-type]


def test_a_frozen_server_is_connection_failed_with_redis_timeout_as_cause(
    server: EmbeddedServer, short_timeout: None
) -> None:
    """redis.TimeoutError the same way (SIGSTOP: a stalled VM); a dispatch keeps its own
    message (its reply lost: the server may have applied it)."""
    with Client(server.url, workers=0, prefix="qt-gone") as client:
        q = client.queue("q")
        q.dispatch({"n": 1}, id="a")
        with frozen(server):
            with pytest.raises(ConnectionFailed) as caught:
                q.counts()
            with pytest.raises(ConnectionFailed, match="reply to queasy_dispatch came"):
                q.dispatch({"n": 2})
        assert_names_the_server(caught.value, server, "Queue.counts")
        assert isinstance(caught.value.__cause__, redis.TimeoutError), caught.value.__cause__
        assert q.counts()["waiting"] == 2  # the frozen dispatch applied on waking: as it says

    async def scenario() -> ConnectionFailed:
        async with AsyncClient(server.url, prefix="qt-gone") as aclient:
            aq = aclient.queue("q")
            await aq.counts()
            with frozen(server):
                with pytest.raises(ConnectionFailed) as caught:
                    await aq.counts()
            assert (await aq.counts())["waiting"] == 2
            return caught.value

    failed = asyncio.run(scenario())
    assert_names_the_server(failed, server, "AsyncQueue.counts")
    assert isinstance(failed.__cause__, redis.TimeoutError), failed.__cause__


def test_other_errors_pass_as_they_are() -> None:
    """Only redis-py's connection errors (and OSError) become ConnectionFailed: a
    QueasyError or a server's error reply is raised as it was, and the iterators of a
    generator method are covered too (none is public yet)."""
    from queasy_py.connfailed import as_connection_failed

    class Owner:
        url = f"redis://:{PASSWORD}@127.0.0.1:1/0"
        name = "q"

        @as_connection_failed
        def refused(self) -> None:
            raise InvalidInput("bad id")

        @as_connection_failed
        def oom(self) -> None:
            raise redis.ResponseError("OOM command not allowed")

        @as_connection_failed
        def pages(self) -> Iterator[int]:
            yield 1
            raise redis.ConnectionError("Connection reset by peer")

        @as_connection_failed
        async def apages(self) -> Any:
            yield 1
            raise redis.TimeoutError("Timeout reading from socket")

    owner = Owner()
    with pytest.raises(InvalidInput, match="bad id") as invalid:
        owner.refused()
    assert invalid.value.__cause__ is None
    with pytest.raises(redis.ResponseError, match="OOM"):
        owner.oom()
    got: list[int] = []
    with pytest.raises(ConnectionFailed, match=r"pages\(\) of queue 'q': cannot reach Redis at "):
        got.extend(owner.pages())
    assert got == [1]

    async def consume() -> list[int]:
        return [item async for item in owner.apages()]

    with pytest.raises(ConnectionFailed, match=r"redis://:\*\*\*@127\.0\.0\.1:1/0 \(Timeout"):
        asyncio.run(consume())


def test_bad_input_before_any_call_does_not_import_redis_py() -> None:
    """The translation looks at redis-py's classes only once redis-py is imported: a call
    refused before it reaches Redis leaves `import queasy_py` as light as it was."""
    code = (
        "import sys\n"
        "from queasy_py import Client, InvalidInput\n"
        "q = Client('redis://127.0.0.1:1', workers=0).queue('q')\n"
        "try:\n"
        "    q.get_job('')\n"
        "except InvalidInput:\n"
        "    pass\n"
        "assert 'redis' not in sys.modules, 'redis-py was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
