"""The server's work per job (issue 14): the commands the library runs inside its FCALLs,
counted by INFO commandstats on a server of this module's own (no other test's calls mix in).

Counts, not times: they are the same on any machine, and each command a job's path runs is a
few microseconds of the server's one core (README "How it scales"). Each limit below is what
the library does since the profile-guided pass; the pass before it ran one more command per
job in each of dispatch, dequeue and finish (and two in finish), so each test fails on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from queasy_py.store.embedded import EmbeddedServer
from queasy_py.store.library import ensure_loaded
from tests.lua_calls import HOST, KEEP, MAXLEN, NOW, Lua

#: commands sent by this module itself, not run inside an FCALL
OUTSIDE = {"fcall", "fcall_ro", "info", "function|load", "function|list", "hello", "ping"}


@pytest.fixture
def lua(own_server: EmbeddedServer) -> Iterator[Lua]:
    conn = redis.Redis.from_url(own_server.url, decode_responses=True)
    ensure_loaded(conn)
    conn.flushall()
    try:
        yield Lua(conn, "cost")
    finally:
        conn.close()


def calls(r: redis.Redis) -> dict[str, int]:
    stats = r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def inner(r: redis.Redis, step: Any) -> dict[str, int]:
    """The commands run inside the FCALLs of `step()` (a name -> calls dict)."""
    before = calls(r)
    step()
    after = calls(r)
    ran = {k: v - before.get(k, 0) for k, v in after.items()}
    return {k: v for k, v in ran.items() if v and k not in OUTSIDE}


def finish_all(lua: Lua, leases: list[tuple[str, str]], client: str = "c1") -> list[int]:
    args: list[Any] = [NOW + 5, client, MAXLEN, *KEEP, HOST, 0]
    for job_id, token in leases:
        args += [job_id, token, 4242, NOW + 1, ""]
    return lua.call("queasy_finish", [lua.B], *args)


def test_dispatch_adds_a_batch_to_waiting_in_one_zadd(lua: Lua) -> None:
    lua.dispatch(("first", "1", ""))  # (the queue's first write: 5.0 marks its layout)
    jobs = [(f"j{i}", '{"n": 1}', "") for i in range(50)]
    ran = inner(lua.r, lambda: lua.dispatch(*jobs))
    # 5.0: no command per new id: one HMGET of B:rec for the batch (4.x: one EXISTS per id),
    # one HSET of B:rec (4.x: one per id), one ZADD; the migration guard's EXISTS (every
    # call: lua/queasy.lua entry), B:parked's HGETALL (a job ready now), the wake
    assert ran == {"exists": 1, "hmget": 1, "hset": 1, "zadd": 1, "hgetall": 1, "spublish": 1}
    assert lua.counts() == {"waiting": 51, "delayed": 0, "blocked": 0, "active": 0}
    lua.r.flushall()
    # the one ZADD takes each new id at its last run_at (a later triple of the same batch
    # updates it: code 2), and an id pushed to a parked client does not enter B:waiting
    codes = lua.dispatch(("a", "1", NOW + 500), ("b", "2", ""), ("a", "3", NOW + 900))
    assert codes == [1, 1, 2]
    assert lua.r.zscore(lua.B + ":waiting", "a") == NOW + 900
    assert lua.get_job("a")["data"] == "3"
    # a parked client subscribed to its push channel takes a ready job straight away
    checkout = lua.dequeue("c9", limit=5, park=True)
    assert checkout.ids == ["b"]
    pubsub = lua.r.pubsub()
    pubsub.ssubscribe(lua.B + ":push:c9")
    try:
        assert lua.dispatch(("p", "1", ""), ("p", "2", ""), ("q", "1", NOW + 10**6)) == [1, 3, 1]
        assert lua.r.zscore(lua.B + ":waiting", "p") is None
        assert lua.counts() == {"waiting": 0, "delayed": 2, "blocked": 1, "active": 2}
        assert lua.r.zscore(lua.B + ":waiting", "q") == NOW + 10**6
    finally:
        pubsub.close()


def test_dequeue_moves_each_record_in_one_command(lua: Lua) -> None:
    lua.dispatch(*[(f"j{i}", "1", "") for i in range(10)])
    ran = inner(lua.r, lambda: lua.dequeue("c1", limit=10))
    # 5.0: no command per record (4.x: an HMGET and a RENAMENX each): one HMGET of B:rec for
    # the call, the records stay where they are; the EXISTS are the migration guard's (every
    # call), with B:parked's: none, so no HDEL of this client's parked slots (a dequeue that
    # takes its limit clears them), and B:blocked's (none: no HMGET of it)
    assert ran.get("hmget") == 1 and "renamenx" not in ran and "rename" not in ran
    assert ran.get("exists") == 2 and "hdel" not in ran and ran.get("hset") == 1
    assert lua.counts()["active"] == 10
    assert lua.dequeue("c2", limit=10, park=True).jobs == [] and lua.parked() == {"c2": 10}
    lua.dispatch(*[(f"k{i}", "1", str(NOW + 100)) for i in range(10)])  # (not pushed)
    ran = inner(lua.r, lambda: lua.dequeue("c2", limit=10, park=True, now=NOW + 100))
    assert ran.get("hdel") == 1 and lua.parked() == {}


def test_finish_drops_leases_and_records_once_per_call(lua: Lua) -> None:
    lua.dispatch(*[(f"j{i}", "1", "") for i in range(10)])
    leases = [(job.id, job.token) for job in lua.dequeue("c1", limit=10).jobs]
    codes: list[int] = []
    ran = inner(lua.r, lambda: codes.extend(finish_all(lua, leases)))
    assert codes == [0] * 10
    # the leases, the records (5.0: fields of B:rec; jobs leased once have no last error in
    # B:err to drop); the DEL of the records kept of earlier ends of these ids
    assert ran["hdel"] == 2 and ran["del"] == 1
    assert ran["xadd"] == 10  # one outcome event per job, as before
    assert lua.r.hlen(lua.B + ":lease:c1") == 0
    assert lua.r.exists(lua.B + ":rec") == 0
    assert lua.counts_all()["finished"] == 10
    # the records go in one HDEL after the loop: a second ack of the same lease in the same
    # call must still find it taken (one event, one end)
    lua.r.flushall()
    lua.dispatch(("a", "1", ""))
    job = lua.dequeue("c1", limit=1).jobs[0]
    assert finish_all(lua, [(job.id, job.token), (job.id, job.token)]) == [0, 1]
    assert lua.r.xlen(lua.B + ":events") == 1
    assert lua.counts_all()["finished"] == 1
    assert lua.r.hexists(lua.B + ":rec", "a") == 0


def test_an_outcome_event_is_one_line_and_its_error(lua: Lua) -> None:
    """Library 4.0.0: an event is one XADD field (`event`, a line) plus the four error fields
    only with an error, instead of 16 fields; the reader turns it into the same schema."""
    lua.dispatch(("a", "1", ""), ("b", "1", ""), ("c", "1", NOW + 1000))
    a, b = lua.dequeue("c1", limit=2).jobs
    assert finish_all(lua, [(a.id, a.token)]) == [0]
    assert lua.fail("c1", b, now=NOW + 7, message="it broke") == 0
    assert lua.cancel("c", now=NOW + 8) == 1
    raw = [fields for _, fields in lua.r.xrange(lua.B + ":events")]
    assert raw[0] == {"event": f"finished a {NOW + 5} {NOW + 1} 4242 {NOW} {NOW} 0 0 0 c1"}
    assert set(raw[1]) == {"event", "error_name", "error_kind", "error_message", "traceback"}
    assert raw[2] == {"event": f"cancelled c {NOW + 8} - - {NOW + 1000} {NOW} 0 0 0 -"}
    finished, failed, cancelled = lua.events()
    assert finished == {
        "id": "a", "queue": "q", "outcome": "finished", "run_at": str(NOW),
        "started_at": str(NOW + 1), "ended_at": str(NOW + 5), "client": "c1", "pid": "4242",
        "retry_count": "0", "stall_count": "0", "timeout_count": "0", "error_name": "",
        "error_kind": "", "error_message": "", "traceback": "", "enqueued_at": str(NOW),
    }  # fmt: skip
    assert (failed["outcome"], failed["error_name"], failed["error_message"]) == (
        "failed", "KeyError", "it broke",
    )  # fmt: skip
    assert failed["pid"] == "42" and failed["traceback"].startswith("Traceback")
    # '-' in the line: unknown, '' as in the schema
    assert (cancelled["pid"], cancelled["started_at"], cancelled["client"]) == ("", "", "")


def test_events_of_library_3_are_read_as_before(lua: Lua) -> None:
    """An entry written by 3.x (16 fields) left in a stream after the upgrade reads as it
    did, next to the 4.0.0 entries, through the one reader (and Queue.events above it)."""
    from queasy_py.store import events

    key = lua.B + ":events"
    old = {
        "id": "x", "queue": "q", "outcome": "failed", "run_at": "5", "started_at": "",
        "ended_at": "9", "client": "c0", "pid": "", "retry_count": "2", "stall_count": "0",
        "timeout_count": "1", "error_name": "E", "error_kind": "permanent",
        "error_message": "m", "traceback": "t", "enqueued_at": "3",
    }  # fmt: skip
    lua.r.xadd(key, old)
    lua.dispatch(("a", "1", ""))
    job = lua.dequeue("c1", limit=1).jobs[0]
    assert finish_all(lua, [(job.id, job.token)]) == [0]
    first, second = events.page(lua.r, key)
    assert {k: v for k, v in first.items() if k != "event_id"} == {
        **old, "run_at": 5, "started_at": None, "ended_at": 9, "pid": None, "retry_count": 2,
        "stall_count": 0, "timeout_count": 1, "enqueued_at": 3,
    }  # fmt: skip
    assert second["id"] == "a" and second["outcome"] == "finished" and second["pid"] == 4242
    assert set(first) == set(second)
    rows = [row for chunk in events.entries(lua.r, key, "0-0", "+", 10) for row in chunk]
    assert [fields for _, fields in rows][0] == old


def test_a_new_record_holds_no_zero_count(lua: Lua) -> None:
    """Library 4.0.0: a dispatch writes id, data, run_at and enqueued_at only (its counts and
    attempts are 0: absent, read as 0), and every reader still shows them."""
    ran = inner(lua.r, lambda: lua.dispatch(("a", '{"n": 1}', "")))
    assert ran["hset"] == 1
    # 5.0: a field of B:rec, its counts and attempts '0'
    assert lua.r.hget(lua.B + ":rec", "a") == f'{NOW} {NOW} 0 0 0 0\t\t{{"n": 1}}'
    rec = lua.record("a")
    assert rec is not None
    counts = {k: rec[k] for k in ("retry_count", "stall_count", "timeout_count", "attempts")}
    assert counts == {"retry_count": "0", "stall_count": "0", "timeout_count": "0", "attempts": "0"}
    job = lua.dequeue("c1", limit=1).jobs[0]
    assert (job.retry_count, job.stall_count, job.timeout_count) == (0, 0, 0)
    assert lua.record("a")["attempts"] == "1"  # the lease it holds now
    assert lua.retry("c1", job, run_at=NOW) == 0
    assert lua.r.hget(lua.B + ":rec", "a").split("\t")[0].split(" ")[2::3] == ["1", "1"]


def test_a_lease_lives_in_the_clients_lease_hash_only(lua: Lua) -> None:
    """Library 4.0.0: dequeue renames the record and writes nothing into it; the lease is in
    B:lease:<client> (4.1.0 to 5.0.0: "<token> <run_at> <enqueued_at> <retry_count>
    <stall_count> <timeout_count> <attempts> <leased_at>"; 5.1.0: "<token> <leased_at>"), and
    every reader shows it as before."""
    lua.dispatch(("a", '"x"', ""), ("b", '"y"', ""))
    ran = inner(lua.r, lambda: lua.dequeue("c1", limit=2, now=NOW + 3))
    assert ran["hset"] == 1  # the call's leases, in one HSET; none into a record
    a, b = lua.call("queasy_leases", [lua.B], NOW, "c1")[1::2]
    held = {"a": f"{a} {NOW + 3}", "b": f"{b} {NOW + 3}"}
    assert lua.r.hgetall(lua.B + ":lease:c1") == held
    assert lua.r.hget(lua.B + ":rec", "a") == f'{NOW} {NOW} 0 0 0 0\t\t"x"'  # (5.0: as it was)
    rec = lua.record("a")
    assert (rec["state"], rec["client"], rec["leased_at"], rec["attempts"]) == (
        "active", "c1", str(NOW + 3), "1",
    )  # fmt: skip
    assert "token" not in rec
    _, page = lua.jobs("active")
    assert sorted((f["id"], f["client"], f["leased_at"], f["attempts"]) for _, f in page) == [
        ("a", "c1", str(NOW + 3), "1"), ("b", "c1", str(NOW + 3), "1"),
    ]  # fmt: skip
    # a token that is only a prefix of the lease's is stale
    job = lua.dequeue("c1", limit=0).jobs  # (nothing more to lease)
    assert job == []
    assert finish_all(lua, [("a", a[:-1]), ("b", b)]) == [1, 0]
    assert lua.r.hgetall(lua.B + ":lease:c1") == {"a": held["a"]}


def test_the_whole_lease_value_is_no_token(lua: Lua) -> None:
    """A lease's value is "<token> ... <leased_at>": an ack that presents all of it, or its
    token and the next words, as its token is stale (a token holds no space), and changes
    nothing."""
    lua.dispatch(("a", '"x"', ""))
    job = lua.dequeue("c1", limit=1).jobs[0]
    assert lua.r.hget(lua.B + ":lease:c1", "a") == f"{job.token} {NOW}"  # (5.1.0's form)
    assert finish_all(lua, [("a", f"{job.token} {NOW}")]) == [1]
    # a lease of 4.1.0's form (as 5.0.0 wrote it): no words of it but the token either
    held = f"{job.token} {NOW} {NOW} 0 0 0 1 {NOW}"
    lua.r.hset(lua.B + ":lease:c1", "a", held)
    assert finish_all(lua, [("a", held)]) == [1]
    assert finish_all(lua, [("a", held.rsplit(" ", 2)[0])]) == [1]
    assert finish_all(lua, [("a", f"{job.token} {NOW}")]) == [1]
    assert lua.r.hget(lua.B + ":lease:c1", "a") == held and lua.r.xlen(lua.B + ":events") == 0
    assert finish_all(lua, [("a", job.token)]) == [0]
    assert lua.r.hget(lua.B + ":ends", "a").split(" ")[4] == "1"  # attempts: this lease


def test_finish_deletes_its_records_and_the_trimmed_ones_in_one_del(lua: Lua) -> None:
    """The records of a call's ended jobs and those of the ends its retention trims go in
    one DEL (the trim's were a second): keep count 4, ten jobs, those with results (kept
    whole) j0, j2 ..., the six oldest ends and records dropped, the four newest kept. (5.0:
    the records kept whole are written, not renamed: the earlier records of their ids go
    first, in one DEL per call, not one per job.)"""
    lua.dispatch(*[(f"j{i}", "1", str(NOW + i)) for i in range(10)])
    jobs = lua.dequeue("c1", limit=10, now=NOW + 10).jobs
    args: list[Any] = [NOW + 20, "c1", MAXLEN, 4, KEEP[1], HOST, 0]
    for i, job in enumerate(jobs):
        args += [job.id, job.token, 4242, NOW + 11, "" if i % 2 else f'{{"r": {i}}}']
    codes: list[int] = []
    ran = inner(lua.r, lambda: codes.extend(lua.call("queasy_finish", [lua.B], *args)))
    assert codes == [0] * 10
    assert ran["del"] == 2 and ran["zremrangebyrank"] == 1 and ran["hset"] == 5 + 2
    assert sorted(lua.r.hkeys(lua.B + ":ends")) == ["j6", "j7", "j8", "j9"]
    kept = sorted(k.rsplit(":", 1)[1] for k in lua.r.keys(lua.B + ":ended:*"))
    assert kept == ["j6", "j8"] and lua.r.zcard(lua.B + ":finished") == 4
    assert lua.r.exists(lua.B + ":rec") == 0


def test_finish_reads_a_jobs_numbers_from_its_lease(lua: Lua) -> None:
    """Library 4.1.0: the lease holds the numbers of the record it leases (which does not
    change while active), so finish parses no record: one HMGET of the lease hash for the
    call (and one of B:stats), where 4.0.0 read each job's record, and one read for all
    the records (that they are there: 5.0, one HMGET of B:rec; 4.x, one EXISTS). The event
    and the end are as before."""
    lua.dispatch(*[(f"j{i}", "1", "") for i in range(10)])
    first = lua.dequeue("c1", limit=1).jobs[0]
    assert lua.retry("c1", first, run_at=NOW, kind="timeout") == 0  # j0: an earlier attempt
    leases = [(job.id, job.token) for job in lua.dequeue("c1", limit=10).jobs]
    codes: list[int] = []
    ran = inner(lua.r, lambda: codes.extend(finish_all(lua, leases)))
    assert codes == [0] * 10
    # the lease hash, the records (B:rec), the last error of j0 (kept whole: B:err), the stats
    assert ran["hmget"] == 4
    assert ran["exists"] == 1  # the migration guard with B:blocked (one read: finish)
    lines = [f["event"] for _, f in lua.r.xrange(lua.B + ":events")]
    assert (
        len(lines) == 11
        and lines[1] == f"finished j0 {NOW + 5} {NOW + 1} 4242 {NOW} {NOW} 0 0 1 c1"
    )
    assert lua.r.hget(lua.B + ":ends", "j0").split(" ")[4:10] == [
        "2", str(NOW), str(NOW), "0", "0", "1",
    ]  # fmt: skip
    assert lua.r.exists(lua.B + ":ended:j0") == 1  # kept whole: it timed out before
    assert lua.record("j0")["timeout_count"] == "1"
    assert lua.r.exists(lua.B + ":ended:j1") == 0
    assert lua.counts_all()["finished"] == 10


def test_an_acked_lease_whose_record_is_gone_is_stale(lua: Lua) -> None:
    """A record deleted around the library while its lease is held: finish reads no record
    (4.1.0), but still finds the lease stale, nothing written for it (its lease kept), and
    the other jobs of the call end."""
    lua.dispatch(("a", "1", ""), ("b", "1", ""), ("c", "1", ""))
    leases = [(job.id, job.token) for job in lua.dequeue("c1", limit=3).jobs]
    lua.r.hdel(lua.B + ":rec", "b")
    assert finish_all(lua, leases) == [0, 1, 0]
    assert list(lua.r.hgetall(lua.B + ":lease:c1")) == ["b"]
    assert [f["event"].split(" ")[1] for _, f in lua.r.xrange(lua.B + ":events")] == ["a", "c"]
    assert lua.r.hget(lua.B + ":ends", "b") is None


def test_finish_caps_the_event_stream_once_per_call(lua: Lua) -> None:
    """Library 4.1.0: finish appends its events without MAXLEN but the last, which caps the
    stream (MAXLEN ~, as each XADD did): the stream stays as short, with no other command
    (a user of the README's ACL line may run no other)."""
    lua.dispatch(*[(f"j{i}", "1", "") for i in range(400)])
    leases = [(job.id, job.token) for job in lua.dequeue("c1", limit=400).jobs]
    args: list[Any] = [NOW + 5, "c1", 10, *KEEP, HOST, 0]
    ran: dict[str, int] = {}
    for k in range(0, 400, 50):
        flat = [x for job_id, token in leases[k : k + 50] for x in (job_id, token, 1, NOW, "")]
        step = inner(lua.r, lambda flat=flat: lua.call("queasy_finish", [lua.B], *args, *flat))
        ran = {name: ran.get(name, 0) + n for name, n in step.items()}
    assert ran["xadd"] == 400 and "xtrim" not in ran
    # MAXLEN ~ 10 drops whole nodes of the stream (100 entries each by default)
    assert lua.r.xlen(lua.B + ":events") <= 110
    assert lua.counts_all()["finished"] == 400


def test_a_calls_events_keep_the_order_of_its_acks(lua: Lua) -> None:
    """Finish appends a 4.1.0 lease's event when the next one comes (the last caps the
    stream); an ack read from its record (here: a record without enqueued_at, which gets a
    lease of 4.0.0's form) appends its own at once: the earlier one goes first."""
    lua.dispatch(("a", "1", ""), ("b", "1", ""), ("c", "1", ""))
    lua.r.hset(lua.B + ":rec", "b", f"{NOW} - 0 0 0 0\t\t1")  # no enqueued_at (an upgraded 3.x)
    leases = [(job.id, job.token) for job in lua.dequeue("c1", limit=3).jobs]
    assert lua.r.hget(lua.B + ":lease:c1", "b") == f"{leases[1][1]} {NOW}"
    assert finish_all(lua, leases) == [0, 0, 0]
    lines = [f["event"] for _, f in lua.r.xrange(lua.B + ":events")]
    assert [line.split(" ")[1] for line in lines] == ["a", "b", "c"]
    assert lines[1] == f"finished b {NOW + 5} {NOW + 1} 4242 {NOW} - 0 0 0 c1"


def test_dispatch_once_keeps_a_batch_of_windows_in_one_hset(lua: Lua) -> None:
    """Library 4.1.0: the windows of a batch of ready jobs go into their bucket in one HSET
    (4.0.0 ran one SET NX GET PX per new id), and each live bucket is read with one HMGET."""
    lua.dispatch(("first", "1", ""))  # (the queue's first write: 5.0 marks its layout)
    jobs = [(f"j{i}", '{"n": 1}', "") for i in range(50)]
    ran = inner(lua.r, lambda: lua.dispatch_once(*jobs, window=60_000))
    # 5.0: no command per new id: per call, the guard's EXISTS, one HMGET of B:rec, one MGET
    # of the ids' B:once:<id> (4.x: one EXISTS per id), one HSET of B:rec (4.x: one per id),
    # the windows' HSET, PEXPIRE and ZADD, B:windows trimmed and read
    assert ran == {
        "exists": 1, "hmget": 1, "mget": 1, "hset": 2, "zadd": 2, "pexpire": 1,
        "zremrangebyscore": 1, "zrange": 1, "hgetall": 1, "spublish": 1,
    }  # fmt: skip
    more = [(f"k{i}", '{"n": 1}', "") for i in range(50)]
    ran = inner(lua.r, lambda: lua.dispatch_once(*more, window=60_000, now=NOW + 1))
    # (the live bucket's HMGET, B:rec's)
    assert ran["hmget"] == 2 and ran["hset"] == 2 and "set" not in ran
