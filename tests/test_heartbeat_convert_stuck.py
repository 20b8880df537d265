"""A queue whose keys of library 4.x cannot be converted (a step of queasy_upgrade fails every
time: a key of it written around the library) beside a queue in 5.0's layout. Before, its
bump failed the whole heartbeat (one pipeline): the supervisor, never alive, ran no job of any
queue, and logged only 'first heartbeat failed: WRONGTYPE ...' without naming the queue."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import pytest
import redis
from runtime_helpers import Runtime, queue_spec, wait_for

from queasy_py.runtime.heartbeat import Heartbeat
from queasy_py.store.connection import loop_client
from queasy_py.store.keys import QueueKeys
from queasy_py.store.library import ensure_loaded


def stuck_4x_queue(r: redis.Redis, prefix: str, name: str, n: int = 600) -> str:
    """A queue of 4.x records whose conversion fails at its second step and every one after
    (B:expiry is a string, written around the library: ZRANGE refuses it, WRONGTYPE); its
    first step (500 records) is refused 'TRYAGAIN upgrading', as a convertible queue's."""
    B = QueueKeys(prefix, name, name).base
    with r.pipeline(transaction=False) as pipe:
        for i in range(n):
            pipe.hset(f"{B}:job:j{i}", mapping={"data": '{"tag": "x"}', "run_at": "1"})
        pipe.zadd(B + ":waiting", {f"j{i}": 1 for i in range(n)})
        pipe.set(B + ":expiry", "garbage")
        pipe.execute()
    return B


def test_a_beat_goes_on_for_the_other_queues_and_names_the_one_that_cannot_convert(
    r: redis.Redis, redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    ensure_loaded(r)
    bad = stuck_4x_queue(r, prefix, "bad")
    ok = QueueKeys(prefix, "ok", "ok").base
    hb = Heartbeat(redis_url, {bad: 100, ok: 100}, lambda: "c1", 5.0, lambda: None)
    with caplog.at_level(logging.INFO, logger="queasy_py"):
        for _ in range(3):
            assert hb.beat_or_reload(r, "c1") is True  # alive (not swept)
    assert r.zscore(ok + ":expiry", "c1") is not None  # the other queue was bumped
    assert r.type(bad + ":expiry") == "string"  # the stuck queue left as it is
    errors = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.ERROR]
    assert len(errors) == 1, errors  # once until it works again, not once per beat
    assert bad in errors[0] and "WRONGTYPE" in errors[0], errors
    # mended around the library: the next beat converts it and says so
    r.delete(bad + ":expiry")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="queasy_py"):
        assert hb.beat_or_reload(r, "c1") is True
    assert r.get(bad + ":layout") == "5"
    assert r.zscore(bad + ":expiry", "c1") is not None
    assert f"heartbeat of queue {bad} works again" in caplog.text


def test_a_beat_still_fails_whole_on_an_error_of_the_server(
    r: redis.Redis, redis_url: str, prefix: str
) -> None:
    """An error that is not a queue's own (here: the library gone, every bump refused) fails
    the beat as before (beat_or_reload loads the library again); a refusal of the server for
    one command is not taken for a queue's keys."""
    ok = QueueKeys(prefix, "ok", "ok").base
    hb = Heartbeat(redis_url, {ok: 100}, lambda: "c1", 5.0, lambda: None)
    ensure_loaded(r)
    r.function_delete("queasy")
    try:
        with pytest.raises(redis.ResponseError, match="(?i)function not found"):
            hb.beat(r, "c1")
        assert hb.broken == {}
    finally:
        ensure_loaded(r)


def test_a_supervisor_runs_the_other_queues_beside_one_that_cannot_convert(
    rt: Runtime, r: redis.Redis
) -> None:
    B = stuck_4x_queue(r, rt.prefix, "bad")
    sup = rt.start({"ok": queue_spec(), "bad": queue_spec()}, workers=1)
    rt.queue("ok").dispatch({"tag": "ok1"})
    wait_for(lambda: rt.records("end", tag="ok1"), 20, "the job of the converted queue runs")
    # its dequeue fails at each poll (1 s): an absence of repeated lines is checked over 3
    polls = time.monotonic() + 3.5
    wait_for(lambda: time.monotonic() > polls, 10, "three polls of the stuck queue")
    log = sup.log()
    assert sup.stop() == 0, log
    assert "first heartbeat failed" not in log, log
    assert log.count(f"ERROR heartbeat of queue {B} failed on its own keys") == 1, log
    assert log.count("ERROR dequeue of bad failed: WRONGTYPE") == 1, log


def test_on_a_cluster_a_beat_goes_on_beside_a_queue_that_cannot_convert(
    local_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"hc-{uuid.uuid4().hex[:8]}"
    r = loop_client(local_cluster.url)
    try:
        ensure_loaded(r)
        bad = stuck_4x_queue(r, prefix, "bad")
        ok = QueueKeys(prefix, "ok", "ok").base
        hb = Heartbeat(local_cluster.url, {bad: 100, ok: 100}, lambda: "c1", 5.0, lambda: None)
        with caplog.at_level(logging.INFO, logger="queasy_py"):
            for _ in range(2):
                assert hb.beat_or_reload(r, "c1") is True
        assert r.zscore(ok + ":expiry", "c1") is not None
        errors = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.ERROR]
        assert len(errors) == 1 and bad in errors[0] and "WRONGTYPE" in errors[0], errors
    finally:
        r.close()
