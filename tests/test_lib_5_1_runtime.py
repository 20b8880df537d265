"""Library 5.1.0's dequeue reply 'rec' end to end: a supervisor (a real subprocess) runs jobs
whose data holds raw tabs and newlines (JSON whitespace, dispatched by raw FCALL), a
megabyte string, or comes with a trace, each once with its data whole: taken from a dequeue
(dispatched before the supervisor listens) and from a push (dispatched while it is idle)."""

from __future__ import annotations

import json

import redis
from runtime_handlers.echo import digest
from runtime_helpers import Runtime, queue_spec, wait_for

from queasy_py.store.keys import QueueKeys
from queasy_py.store.library import ensure_loaded

ECHO = "tests.runtime_handlers.echo"
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def jobs(tag: str) -> dict[str, str]:
    """id -> data as sent (raw JSON text)."""
    return {
        f"{tag}-ws": '{"tag":\t"' + tag + '-ws",\n "v": "a\\tb\\nc"\r\n}',
        f"{tag}-big": json.dumps({"tag": f"{tag}-big", "v": "x\t" * 500_000}),
        f"{tag}-uni": json.dumps({"tag": f"{tag}-uni", "v": "é\u2028\x00"}, ensure_ascii=False),
    }


def dispatch(r: redis.Redis, B: str, sent: dict[str, str], trace: str) -> None:
    for id, data in sent.items():
        assert r.fcall("queasy_dispatch", 1, B, "", 1, "replace", 0, trace, id, data, "") == [1]


def check(rt: Runtime, sent: dict[str, str]) -> None:
    for id, data in sent.items():
        tag = json.loads(data)["tag"]
        done = wait_for(lambda tag=tag: rt.records("end", tag=tag), 30, f"{id} run")
        assert len(done) == 1, done
        assert done[0]["digest"] == digest(json.loads(data)), id


def test_records_with_tabs_newlines_a_megabyte_and_a_trace_run_once_whole(
    rt: Runtime, r: redis.Redis
) -> None:
    ensure_loaded(r)
    B = QueueKeys(rt.prefix, "q", "q").base
    before = jobs("deq")
    dispatch(r, B, before, TRACE)
    sup = rt.start({"q": queue_spec(ECHO)}, workers=2)
    check(rt, before)
    pushed = jobs("push")
    dispatch(r, B, pushed, "")
    check(rt, pushed)
    assert sup.stop() == 0
    assert len(rt.records("end")) == len(before) + len(pushed)
    log = sup.log()
    assert "malformed" not in log and "ERROR" not in log, log
