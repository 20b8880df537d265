"""A dispatch whose reply is lost after the server applied it is never sent again (it could
create a blocked copy of a job that already started: a job run twice); one that could not
have reached the server is. Real server, behind a small TCP proxy that can hold back a reply.
"""

from __future__ import annotations

import pytest
import redis
from lua_calls import live
from proxy import Proxy, proxy_fixture, through  # noqa: F401 -- the `proxy` fixture

from queasy_py import Client, ConnectionFailed


def test_a_dispatch_whose_reply_is_lost_is_not_sent_again(
    proxy: Proxy, prefix: str, r: redis.Redis, redis_url: str
) -> None:
    with Client(through(proxy, redis_url), workers=0, prefix=prefix) as client:
        q = client.queue("q")
        q.dispatch({"warm": True}, id="warm")  # the connection is open and used
        # the server applies the dispatch; before its reply arrives a supervisor dequeues the
        # job (it starts), then the connection breaks
        proxy.on_reply = lambda: r.fcall(  # server clock, 2 jobs, expiry 10 s, no park
            "queasy_dequeue", 1, q.keys.base, "", "sup-1", "n1", 2, 10_000, 100, 0
        )
        with pytest.raises(ConnectionFailed, match="may have applied"):
            q.dispatch({"n": 1}, id="x")
        # nothing was sent again: no blocked copy of the running job
        assert live(q.counts()) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 2}
        info = q.get_job("x")
        assert info is not None and info.state == "active"


def test_a_connection_the_server_closed_is_replaced_before_sending(
    proxy: Proxy, prefix: str, r: redis.Redis, redis_url: str
) -> None:
    with Client(through(proxy, redis_url), workers=0, prefix=prefix) as client:
        q = client.queue("q")
        q.dispatch({}, id="a")
        proxy.drop_clients()
        q.dispatch({}, id="b")  # the closed connection is noticed and replaced: no error
        assert q.counts()["waiting"] == 2
