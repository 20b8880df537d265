"""How many jobs one ack call (queasy_finish, queasy_retry, queasy_fail) takes: at most
MAX_ACKS (1000). Each hands lists of up to two values per job to one command (HMGET, HDEL,
DEL, ZADD, HSET), and Lua's stack holds 8000 values: a finish of 4500 jobs failed after its
records had ended and its leases were gone, with no end kept ("too many results to
unpack"), a job lost whole. Such a call is refused before its first write, and the
supervisor sends the acks it kept through an outage in calls of at most MAX_ACKS."""

from __future__ import annotations

import pytest
import redis
from lua_calls import HOST, KEEP, MAXLEN, NOW, Leased, Lua, snapshot

from queasy_py.runtime import outcomes
from queasy_py.runtime.pool import Running
from queasy_py.store.library import ensure_loaded

MAX_ACKS = 1000


@pytest.fixture
def lua(r: redis.Redis, redis_url: str, prefix: str) -> Lua:
    with redis.Redis.from_url(redis_url) as conn:
        ensure_loaded(conn)
    return Lua(r, prefix)


def leased(lua: Lua, n: int) -> list[Leased]:
    """`n` jobs dispatched and leased to c1."""
    for start in range(0, n, 1000):
        jobs = [(f"j{i}", '"x"', NOW) for i in range(start, min(n, start + 1000))]
        assert set(lua.dispatch(*jobs)) == {1}
    out: list[Leased] = []
    while len(out) < n:
        out += lua.dequeue("c1", limit=1000).jobs
    assert len(out) == n
    return out


def ack_args(op: str, jobs: list[Leased]) -> list:
    args: list = []
    for job in jobs:
        if op == "finish":
            args += [job.id, job.token, "42", NOW, ""]
        elif op == "retry":
            args += [job.id, job.token, NOW, "retry", "42", NOW, "E", "m", "t"]
        else:
            args += [job.id, job.token, "", "", "42", NOW, "E", "permanent", "m", "t"]
    return args


HEADS = {
    "finish": [NOW + 5, "c1", MAXLEN, *KEEP, HOST, 0],
    "retry": [NOW + 5, "c1", MAXLEN],
    "fail": [NOW + 5, "c1", MAXLEN, *KEEP, HOST, 0],
}


@pytest.mark.parametrize("op", ["finish", "retry", "fail"])
def test_an_ack_call_of_more_than_max_acks_jobs_is_refused_and_writes_nothing(
    lua: Lua, r: redis.Redis, prefix: str, op: str
) -> None:
    jobs = leased(lua, MAX_ACKS + 1)
    before = snapshot(r, prefix)
    with pytest.raises(redis.ResponseError, match=f"at most {MAX_ACKS} jobs per call, got 1001"):
        lua.call(f"queasy_{op}", [lua.B], *HEADS[op], *ack_args(op, jobs))
    assert snapshot(r, prefix) == before
    codes = lua.call(f"queasy_{op}", [lua.B], *HEADS[op], *ack_args(op, jobs[:MAX_ACKS]))
    assert codes == [0] * MAX_ACKS
    assert r.hlen(f"{lua.B}:lease:c1") == 1


def test_acks_kept_beyond_one_call_go_in_several_and_every_job_ends(
    lua: Lua, r: redis.Redis
) -> None:
    """4500 finishes of one queue (what a supervisor running 4500 small jobs keeps through an
    outage): ack_commands sends them in calls of at most MAX_ACKS, and each job ends."""
    jobs = leased(lua, 4500)
    acks = [
        outcomes.finish(
            Running(i, "q", job.id, job.token, b'"x"', job.run_at, 0, 0, 0, 1, 0.0),
            lua.B,
            42,
            NOW,
        )
        for i, job in enumerate(jobs)
    ]
    headers = {("finish", lua.B): [MAXLEN, 10_000, 3_600_000, HOST, 0]}
    commands, groups = outcomes.ack_commands("c1", acks, headers)
    assert [len(g) for g in groups] == [1000, 1000, 1000, 1000, 500]
    for command, group in zip(commands, groups, strict=True):
        assert r.execute_command(*command) == [0] * len(group)
    assert r.hlen(f"{lua.B}:lease:c1") == 0
    counts = lua.counts_all()
    assert counts["active"] == 0 and counts["finished"] == 4500, counts


@pytest.mark.parametrize("once", [False, True], ids=["dispatch", "dispatch_once"])
def test_a_dispatch_of_more_than_1000_jobs_is_refused_and_writes_nothing(
    lua: Lua, r: redis.Redis, prefix: str, once: bool
) -> None:
    """A dispatch of 5000 jobs failed the same way (ZADD unpack(scored)) after it had written
    its 5000 records: none of them in B:waiting, so none ever ran. The producer API sends
    chunks of 500 (queue.DISPATCH_CHUNK); a raw FCALL of more than 1000 is refused."""
    lua.add("w")
    before = snapshot(r, prefix)
    jobs = [(f"k{i}", '"x"', NOW) for i in range(1001)]

    def send(js: list) -> list[int]:
        return lua.dispatch_once(*js, window=1000) if once else lua.dispatch(*js)

    with pytest.raises(redis.ResponseError, match="at most 1000 jobs per call, got 1001"):
        send(jobs)
    assert snapshot(r, prefix) == before
    assert send(jobs[:1000]) == [1] * 1000
    assert lua.counts()["waiting"] == 1001


def test_a_dequeue_with_a_limit_over_1000_leases_1000_and_loses_none(
    lua: Lua, r: redis.Redis
) -> None:
    """A dequeue of limit 5000 with 5000 ready jobs moved their records to active and out of
    B:waiting, then failed at the HSET of their leases: 5000 jobs active under no lease, run
    by no one, counted nowhere. A limit over 1000 leases 1000 (the supervisor asks 1000 at
    most: scheduler.MAX_BATCH)."""
    for start in range(0, 5000, 1000):
        assert set(lua.dispatch(*[(f"k{i}", '"x"', NOW) for i in range(start, start + 1000)]))
    checkout = lua.dequeue("c1", limit=5000)
    assert len(checkout.jobs) == 1000 and checkout.next_run_at == str(NOW)
    assert r.hlen(f"{lua.B}:lease:c1") == 1000
    counts = lua.counts()
    assert counts["waiting"] == 4000 and counts["active"] == 1000, counts
