"""A supervisor alone (no producer) on a queue that library 4.4.0 left with a backlog: its
first heartbeat converts the queue's 4.x keys (lua/queasy.lua, queasy_upgrade) before its loop
asks for jobs, and every job runs. 5.0.0's supervisor took the refused bump ('TRYAGAIN
upgrading') as a failed heartbeat (an ERROR, then a WARNING about a cluster slot moving, on a
single server) and converted a step per beat or per backoff of its loop."""

from __future__ import annotations

import json

import redis
from lua_calls import Lua
from runtime_helpers import Runtime, queue_spec, wait_for

from tests.test_upgrade_5 import BUDGET, load


def test_a_supervisor_alone_converts_a_4_x_backlog_and_runs_it(rt: Runtime, r: redis.Redis) -> None:
    load(r, "4.4.0")
    lua = Lua(r, rt.prefix, "up")
    n = 3 * BUDGET + 100  # four steps of the conversion
    for start in range(0, n, 1000):
        jobs = [
            (f"j{i}", json.dumps({"tag": f"j{i}"}), "") for i in range(start, min(n, start + 1000))
        ]
        assert set(
            lua.call(
                "queasy_dispatch", [lua.B], "", 1, "replace", 0, "", *[p for j in jobs for p in j]
            )
        ) == {1}
    load(r, None)
    sup = rt.start({"up": queue_spec()}, workers=2)
    wait_for(lambda: len(rt.records("end")) >= n, 60, f"{n} jobs run")
    assert r.get(lua.B + ":layout") == "5"
    assert sup.stop() == 0
    log = sup.log()
    for line in ("heartbeat failed", "slot moving", "Redis unreachable", "retrying with backoff"):
        assert line not in log, line
    assert "converted the keys of library 4.x" in log
