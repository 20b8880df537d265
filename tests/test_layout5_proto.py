"""The 5.0 layout prototype (issue 14, benchmarks/layout5): its harness runs and its own
correctness check passes, so CI keeps both working; and the prototype refuses what the
library refuses. A measurement, not the library: nothing in queasy_py calls it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from queasy_py.store.embedded import EmbeddedServer

REPO = Path(__file__).resolve().parent.parent
PROTO = REPO / "benchmarks" / "layout5" / "proto.lua"


def test_the_harness_runs_both_layouts_and_checks_the_prototype() -> None:
    """A small run through today's library and both prototype variants: the table has each
    layout's path, and the correctness check (every job ended once, the ends kept, a blocked
    duplicate promoted, stale tokens refused, a dead client swept, bad input refused) passed
    (the harness exits 1 otherwise)."""
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "layout5" / "cost.py"), "--n", "1200",
         "--keep", "500"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    for layout in ("4", "5", "5h"):
        assert f"| **{layout}** | **a job's path** |" in out.stdout
    assert "correctness check passed: layouts 5, 5h" in out.stdout


@pytest.fixture
def proto(own_server: EmbeddedServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(own_server.url, decode_responses=True)
    conn.function_load(PROTO.read_text(), replace=True)
    conn.flushall()
    try:
        yield conn
    finally:
        conn.close()


B = "t5:{q}:q"
NOW = 1_800_000_000_000


def fcall(r: redis.Redis, name: str, *args: object) -> list:
    return r.execute_command("FCALL", name, 1, B, *args)  # type: ignore[no-any-return]


@pytest.mark.parametrize("pre", ["q5_", "q5h_"])
def test_a_finish_of_a_record_gone_is_stale_and_changes_nothing(
    proto: redis.Redis, pre: str
) -> None:
    """The prototype's finish reads the record (its numbers): a lease whose record was
    deleted around it is stale, its lease kept, no event or end for it; the others end."""
    fcall(proto, pre + "dispatch", NOW, 1, "replace", 0, "", "a", "1", "", "b", "2", "")
    got = fcall(proto, pre + "dequeue", NOW, "c1", "n", 5, 60000, 100)
    tokens = dict(zip(got[2::3], got[3::3], strict=True))
    if pre == "q5_":
        proto.hdel(B + ":rec", "b")
    else:
        proto.delete(B + ":job:b")
    flat = [x for job in ("a", "b") for x in (job, tokens[job], "", "", "")]
    codes = fcall(proto, pre + "finish", NOW + 1, "c1", 100, 10, 3600000, "h", 0, *flat)
    assert codes == [0, 1]
    assert list(proto.hgetall(B + ":lease:c1")) == ["b"]
    assert proto.hkeys(B + ":ends") == ["a"]
    (entry,) = proto.xrange(B + ":events")
    assert entry[1]["events"].startswith("finished a ")


def test_bad_input_is_refused_with_nothing_written(proto: redis.Redis) -> None:
    cases = [
        (("q5_dispatch", NOW, 1, "replace", 0, "", "a b", "1", ""), "id"),
        (("q5_dispatch", NOW, 1, "replace", 0, "", "a", "Infinity", ""), "not JSON"),
        (("q5_dispatch", NOW, 1, "replace", 0, "", "a", "1"), "groups of 3"),
        (("q5_dispatch", NOW, 2, "replace", 0, "", "a", "1", ""), "update_data"),
        (("q5_dequeue", NOW, "c1", "n", 5, 0, 100), "expiry ms"),
        (("q5_finish", NOW, "c1", 100, 10, 3600000, "h", 0, "a", "t", "-1", "", ""), "pid"),
    ]
    for args, what in cases:
        with pytest.raises(redis.ResponseError, match=f"^INVALID .*{what}"):
            fcall(proto, *args)
    assert proto.keys("*") == []


def test_garbled_values_written_around_it_fail_no_call_half_way(proto: redis.Redis) -> None:
    """A waiting record and the ends index's head garbled around the prototype: a dispatch
    replaces the record (a new job), a finish that trims reads the head as not old; neither
    call fails after a write."""
    fcall(proto, "q5_dispatch", NOW, 1, "replace", 0, "", "a", "1", "")
    proto.hset(B + ":rec", "a", "garbage")
    assert fcall(proto, "q5_dispatch", NOW, 1, "replace", 0, "", "a", "2", "") == [1]
    got = fcall(proto, "q5_dequeue", NOW, "c1", "n", 5, 60000, 100)
    assert got[2] == "a" and got[4].endswith("\t2")
    proto.lpush(B + ":finished", "x y")
    codes = fcall(proto, "q5_finish", NOW + 1, "c1", 100, 10, 1, "h", 0, "a", got[3], "", "", "")
    assert codes == [0] and proto.hkeys(B + ":ends") == ["a"]
