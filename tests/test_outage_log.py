"""How the loop logs what Redis refuses (runtime/outage.py): a cluster's redirections (MOVED,
ASK, the migration guard's TRYAGAIN, redis-py's "TTL exhausted" after following them) are
expected and followed: one WARNING line per REDIRECT_LOG_INTERVAL; a real outage (a lost
node or connection, CLUSTERDOWN, OOM) is an ERROR, once per kind. The supervisor's own logs
during a reshard and a killed primary: tests/test_cluster_ops.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
from redis.exceptions import AskError, ClusterDownError, ClusterError, MovedError, TryAgainError

from queasy_py.runtime import outage
from queasy_py.runtime.outage import Outage, RedirectLog
from queasy_py.store.clusterpipe import NodeLost


def fresh() -> Outage:
    out = Outage()
    out.redirects = RedirectLog()  # not the process's shared one: its own throttle
    return out


def lines(caplog: Any) -> list[tuple[int, str]]:
    return [(rec.levelno, rec.getMessage()) for rec in caplog.records]


@pytest.mark.parametrize(
    "exc",
    [
        MovedError("3999 127.0.0.1:7001"),
        AskError("3999 127.0.0.1:7001"),
        TryAgainError("the slot of ns:{q}:q is moving"),
        ClusterError("Command # 1 (FCALL queasy_bump) of pipeline caused error: TTL exhausted."),
    ],
)
def test_a_redirection_is_one_warning_per_interval(exc: BaseException, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG, logger="queasy_py")
    out = fresh()
    for _ in range(3):
        out.retry_at = 0.0  # the next call is a new try, past its backoff
        out.down(exc)
        out.up()
    assert [level for level, _ in lines(caplog)] == [logging.WARNING]
    assert "slot moving" in lines(caplog)[0][1] and type(exc).__name__ in lines(caplog)[0][1]
    assert out.errors == 3 and out.retry_at > 0  # still backed off and counted


def test_redirections_are_logged_again_after_the_interval(caplog: Any, monkeypatch: Any) -> None:
    caplog.set_level(logging.DEBUG, logger="queasy_py")
    log = RedirectLog()
    log("rounds", MovedError("1 127.0.0.1:7001"))
    log("heartbeat", MovedError("1 127.0.0.1:7001"))  # shared: not again
    monkeypatch.setattr(outage, "REDIRECT_LOG_INTERVAL", 0.0)
    log("rounds", MovedError("1 127.0.0.1:7001"))
    assert [level for level, _ in lines(caplog)] == [logging.WARNING, logging.WARNING]


@pytest.mark.parametrize(
    "exc",
    [
        redis.ConnectionError("Error 111 connecting to 127.0.0.1:7001. Connection refused."),
        NodeLost("127.0.0.1:7001 lost its connection"),  # a TRYAGAIN by class: still an outage
        ClusterDownError("The cluster is down"),
        redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"),
        ClusterError("Redis Cluster cannot be connected."),
    ],
)
def test_a_real_outage_stays_an_error(exc: BaseException, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG, logger="queasy_py")
    out = fresh()
    out.down(exc)
    out.retry_at = 0.0
    out.down(exc)  # the same kind: not logged again
    out.up()
    assert [level for level, _ in lines(caplog)] == [logging.ERROR, logging.WARNING]
    assert "unreachable or refusing" in lines(caplog)[0][1]


def test_a_redirection_during_an_outage_does_not_end_it(caplog: Any) -> None:
    caplog.set_level(logging.DEBUG, logger="queasy_py")
    out = fresh()
    out.down(redis.ConnectionError("Connection refused"))
    out.retry_at = 0.0
    out.down(MovedError("3999 127.0.0.1:7001"))  # the promoted replica's MOVED, meanwhile
    out.up()
    assert lines(caplog)[0][0] == logging.ERROR
    assert lines(caplog)[-1] == (logging.WARNING, "Redis answers again (after ConnectionError)")
