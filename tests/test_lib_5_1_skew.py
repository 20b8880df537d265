"""A supervisor of 5.1.0 (it asks queasy_dequeue for the reply 'rec', ARGV[8]) on a server
whose library is 5.0.0 again: a 5.0.0 process of a rolling upgrade that found the library
gone (a server restarted without its data, FUNCTION FLUSH) loaded its own first, and the
5.1.0 supervisor, whose calls never met 'function not found', keeps calling it. 5.0.0 ignores
ARGV[8] and replies 8 values per job: read 3 by 3 they parsed as no job (every dequeue
'malformed', its leases taken and handed back a reconcile later, again and again); nothing
ran until the supervisor was restarted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from runtime_helpers import ACT, Runtime, queue_spec, runtime

from queasy_py.store.keys import QueueKeys
from queasy_py.store.library import ensure_loaded, source

OLD = Path(__file__).parent / "fixtures" / "queasy-5.0.0.lua"


@pytest.fixture
def rt(
    request: Any, redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path
) -> Iterator[Runtime]:
    with runtime(request, redis_url, prefix, r, tmp_path) as rt:
        try:
            yield rt
        finally:  # the bundled library again for the tests after this one
            r.function_load(source(), replace=True)


def dispatch(r: redis.Redis, B: str, id: str, data: str) -> None:
    assert r.fcall("queasy_dispatch", 1, B, "", 1, "replace", 0, "", id, data, "") == [1]


def test_a_5_1_supervisor_runs_jobs_on_a_library_that_is_5_0_0_again(
    rt: Runtime, r: redis.Redis
) -> None:
    ensure_loaded(r)
    B = QueueKeys(rt.prefix, "q", "q").base
    sup = rt.start({"q": queue_spec(ACT, size=100)}, workers=1)  # one job at a time
    dispatch(r, B, "gate", '{"tag": "gate", "gate": "g"}')
    rt.wait_records(1, "start", tag="gate")
    r.function_load(OLD.read_text(), replace=True)  # a 5.0.0 process reloaded its own
    assert r.fcall("queasy_library", 0) == "queasy_py 5.0.0"
    for n in range(3):  # waiting behind the gate: each one a dequeue of the loop
        dispatch(r, B, f"j{n}", f'{{"tag": "j{n}"}}')
    rt.open_gate("g")
    for n in range(3):
        rt.wait_records(1, "end", tag=f"j{n}", timeout=20)
    assert sup.stop() == 0
    for n in range(3):
        assert len(rt.records("start", tag=f"j{n}")) == 1  # once each
    assert r.fcall("queasy_library", 0) == "queasy_py 5.1.1"  # loaded again
    log = sup.log()
    assert "not library 5.1.0's reply 'rec'" in log
    assert "the queasy library is gone" not in log  # (it was not: it was older)
