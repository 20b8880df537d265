"""Shutdown of a real supervisor subprocess under signals and Redis faults: the second signal
skips the drain whenever it comes, SIGHUP, and the exit codes. The queues live on a server
of the test's own (it is frozen), the handlers' records on the session's server."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from runtime_helpers import Runtime, queue_spec
from test_loop_faults import Own


@pytest.fixture
def own() -> Iterator[Own]:
    server = Own()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def rt(own: Own, prefix: str, r: redis.Redis, redis_url: str, tmp_path: Path) -> Iterator[Runtime]:
    own_r = redis.Redis.from_url(own.url, decode_responses=True)
    with Runtime(own.url, prefix, own_r, tmp_path, records=(redis_url, r)) as runtime:
        yield runtime
    own_r.close()


def test_a_second_signal_while_pushes_are_stopped_skips_the_drain(rt: Runtime, own: Own) -> None:
    """The first signal stops the pushes first (queasy_unpark, waiting for its marks); with
    the server frozen that takes LOOP_REDIS_TIMEOUT. A second signal meanwhile must still
    skip the wait for running jobs (it was counted as the first: 60 s of drain)."""
    sup = rt.start({"q": queue_spec()}, workers=1, shutdown_timeout=60.0)
    q = rt.queue("q")
    q.dispatch({"tag": "g", "gate": "never"}, id="g")
    rt.wait_records(1, "start", tag="g")
    own.freeze()
    sup.signal(signal.SIGTERM)
    time.sleep(0.5)  # the loop took the first signal and is stopping the pushes
    sup.signal(signal.SIGTERM)
    time.sleep(2.5)  # the unpark gave up (frozen server)
    own.thaw()
    assert sup.wait(timeout=20.0) == 0, sup.log()
    assert "second signal: not waiting for running jobs" in sup.log()
    job = q.get_job("g")
    assert job is not None and job.state == "waiting" and job.stall_count == 0
