"""Every producer write on one server (dispatch_many, dispatch_batch, cancel, purge, sync and
async) reaches the server once: when its reply is lost after the server applied it, it is not
sent again (redis-py's retry would: a dispatch_many sent again after its jobs started makes
blocked copies of them, a cancel or a purge sent again removes what came in between), and
ConnectionFailed names the call and says the server may have applied it. Reads keep redis-py's
retry. Real server, behind the proxy of tests/proxy.py that holds back one reply (after it,
`on_reply` writes on the server what a concurrent client would)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from lua_calls import live
from proxy import Proxy, proxy_fixture, through  # noqa: F401 -- the `proxy` fixture

from queasy_py import Client, ConnectionFailed, Queue
from queasy_py.aio import AsyncClient

MAY_HAVE_APPLIED = "may have applied"


@pytest.fixture
def other(redis_url: str, prefix: str) -> Iterator[Queue]:
    """Queue 'q' of a client of its own, straight to the server: the concurrent writer."""
    with Client(redis_url, workers=0, prefix=prefix) as client:
        yield client.queue("q")


def dequeue_all(q: Queue, r: redis.Redis) -> Callable[[], Any]:
    """What runs when the held-back reply arrives: a supervisor dequeues (starts) the jobs."""
    return lambda: r.fcall("queasy_dequeue", 1, q.keys.base, "", "sup-1", "n1", 10, 10_000, 100, 0)


def lost(call: str) -> str:
    """The message of `call` of queue 'q' whose reply was lost."""
    return rf"^{call}\(\) of queue 'q': Redis at .*: the connection was lost .*{MAY_HAVE_APPLIED}"


# ---------------------------------------------------------------------------- sync


def test_dispatch_many_whose_reply_is_lost_is_not_sent_again(
    proxy: Proxy, prefix: str, r: redis.Redis, redis_url: str, other: Queue
) -> None:
    with Client(through(proxy, redis_url), workers=0, prefix=prefix) as client:
        q = client.queue("q")
        q.dispatch({}, id="warm")  # connected, registered
        q.counts()  # and the pool holds an open connection (its handshake is not held back)
        proxy.on_reply = dequeue_all(q, r)
        with pytest.raises(ConnectionFailed, match=lost("dispatch_many")) as caught:
            q.dispatch_many([{"data": 1, "id": "a"}, {"data": 2, "id": "b"}])
        assert isinstance(caught.value.__cause__, redis.ConnectionError)
        # sent once: no blocked copies of the jobs that started
        assert live(other.counts()) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 3}


def test_dispatch_batch_whose_reply_is_lost_is_not_sent_again(
    proxy: Proxy, prefix: str, r: redis.Redis, redis_url: str, other: Queue
) -> None:
    with Client(through(proxy, redis_url), workers=0, prefix=prefix) as client:
        q = client.queue("q")
        q.dispatch({}, id="warm")
        q.counts()
        proxy.on_reply = dequeue_all(q, r)
        with pytest.raises(ConnectionFailed, match=lost("dispatch_batch")):
            q.dispatch_batch([{"data": 1, "id": "a"}, {"data": 2, "id": "b"}])
        assert live(other.counts()) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 3}


def test_cancel_whose_reply_is_lost_is_not_sent_again(
    proxy: Proxy, prefix: str, redis_url: str, other: Queue
) -> None:
    with Client(through(proxy, redis_url), workers=0, prefix=prefix) as client:
        q = client.queue("q")
        q.dispatch({"first": True}, id="a")
        q.counts()
        # cancelled; then, before the reply, another client dispatches id 'a' again
        proxy.on_reply = lambda: other.dispatch({"again": True}, id="a")
        with pytest.raises(ConnectionFailed, match=lost("cancel")):
            q.cancel("a")
        info = other.get_job("a")  # sent once: the new job was not cancelled too
        assert info is not None and info.state == "waiting" and info.data == {"again": True}


def test_purge_whose_reply_is_lost_is_not_sent_again(
    proxy: Proxy, prefix: str, redis_url: str, other: Queue
) -> None:
    with Client(through(proxy, redis_url), workers=0, prefix=prefix) as client:
        q = client.queue("q")
        q.dispatch({}, id="a")
        q.dispatch({}, id="b")
        q.counts()
        proxy.on_reply = lambda: other.dispatch({}, id="c")
        with pytest.raises(ConnectionFailed, match=lost("purge")):
            q.purge("waiting")
        assert [j.id for j in other.jobs("waiting")[0]] == ["c"]  # not purged by a resend


def test_reads_and_writes_after_the_server_closed_the_connections(
    proxy: Proxy, prefix: str, redis_url: str
) -> None:
    """A connection the server closed (a restart) is replaced before anything is sent on it:
    reads and writes after it just work (the writes are sent once, not blind)."""
    with Client(through(proxy, redis_url), workers=0, prefix=prefix) as client:
        q = client.queue("q")
        q.dispatch({"n": 1}, id="a")
        assert q.counts()["waiting"] == 1  # the pool holds a read connection, FastCall its own
        proxy.drop_clients()
        info = q.get_job("a")
        assert info is not None and info.data == {"n": 1}
        proxy.drop_clients()
        q.dispatch_many([{"data": 2, "id": "b"}])
        proxy.drop_clients()
        assert q.cancel("a") and q.purge("waiting") == 1 and q.counts()["waiting"] == 0


# ---------------------------------------------------------------------------- async


def test_async_writes_whose_reply_is_lost_are_not_sent_again(
    proxy: Proxy, prefix: str, r: redis.Redis, redis_url: str, other: Queue
) -> None:
    """AsyncQueue's dispatch_many, dispatch_batch, cancel and purge, as above."""

    async def scenario() -> None:
        async with AsyncClient(through(proxy, redis_url), prefix=prefix) as client:
            q = client.queue("q")
            await q.dispatch({}, id="warm")
            for call, write in (
                ("dispatch_many", lambda: q.dispatch_many([{"data": 1, "id": "a"}])),
                ("dispatch_batch", lambda: q.dispatch_batch([{"data": 1, "id": "b"}])),
            ):
                await q.counts()  # an open connection in the pool (the last one was lost)
                proxy.on_reply = dequeue_all(other, r)
                with pytest.raises(ConnectionFailed, match=lost(call)) as caught:
                    await write()
                assert isinstance(caught.value.__cause__, redis.ConnectionError)
            live_counts = live(await q.counts())
            assert live_counts == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 3}

            await q.dispatch({"first": True}, id="c")
            await q.counts()
            proxy.on_reply = lambda: other.dispatch({"again": True}, id="c")
            with pytest.raises(ConnectionFailed, match=lost("cancel")):
                await q.cancel("c")
            info = await q.get_job("c")
            assert info is not None and info.state == "waiting" and info.data == {"again": True}

            await q.counts()
            proxy.on_reply = lambda: other.dispatch({}, id="d")
            with pytest.raises(ConnectionFailed, match=lost("purge")):
                await q.purge("waiting")
            assert [j.id for j in (await q.jobs("waiting"))[0]] == ["d"]

    asyncio.run(scenario())
