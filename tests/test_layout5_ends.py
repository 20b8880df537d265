"""Library 5.0: the end of an attempt (finish, retry, fail, cancel, the sweep, requeue, purge)
on the one-hash layout replies and stores exactly as 4.4.0 does for the same calls.

Each test makes a queue's state with 4.4.0's own calls, copies it into 5.0's layout (as the
upgrade would: tests/layout5_twin.py), then runs the same calls on both libraries and
compares every reply and every stored key (events, ends, kept records, records, last
errors, leases, stats)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from layout5_twin import Twin, load_both

from queasy_py.store.library import source

NOW = 1_700_000_000_000
EXPIRY = 10_000
MAXLEN = 1000
KEEP = (100, 3_600_000)
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def conn(own_server: Any) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(own_server.url, decode_responses=True)
    load_both(r, source())
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def twin(conn: redis.Redis) -> Twin:
    return Twin(conn, f"t{uuid.uuid4().hex[:8]}")


# ---------------------------------------------------------------- 4.4.0's calls (p4 only)


def dispatch(
    t: Twin, *ids: str, now: int = NOW, run_at: Any = "", trace: str = "", **f: Any
) -> Any:
    flags = [f.get("update_data", 1), f.get("mode", "replace"), f.get("reset", 1), trace]
    flat = [x for id in ids for x in (id, f'"{id} {f.get("tag", "")}"', run_at)]
    return t.old("dispatch", now, *flags, *flat)


def dequeue(t: Twin, client: str, nonce: str, limit: int = 10, now: int = NOW) -> dict[str, str]:
    """Leases for `client`: id -> token."""
    row = t.old("dequeue", now, client, nonce, limit, EXPIRY, MAXLEN, 0)
    return {row[i]: row[i + 1] for i in range(2, len(row), 8)}


def retried(
    t: Twin, client: str, tokens: dict[str, str], kinds: dict[str, str], now: int = NOW
) -> None:
    args = []
    for id, kind in kinds.items():
        args += [id, tokens[id], now, kind, "7", now - 3, "ValueError", f"bad {id}", f"tb {id}\n"]
    assert t.old("retry", now, client, MAXLEN, *args) == [0] * len(kinds)


# ---------------------------------------------------------------- calls on both


def finish(
    t: Twin,
    client: str,
    acks: list[tuple[str, str, str]],
    now: int = NOW + 10,
    keep: tuple[int, int] = KEEP,
    notify: int = 0,
) -> list[int]:
    """acks: (id, token, result) each."""
    args = [x for id, token, result in acks for x in (id, token, "42", now - 5, result)]
    return t.both("finish", now, client, MAXLEN, *keep, "host a b", notify, *args)


def retry(
    t: Twin, client: str, acks: list[tuple[str, str, Any, str]], now: int = NOW + 10
) -> list[int]:
    """acks: (id, token, run_at, kind) each."""
    args = []
    for id, token, run_at, kind in acks:
        args += [id, token, run_at, kind, "43", now - 5, "OSError", f"no {id}", f"Traceback {id}\n"]
    return t.both("retry", now, client, MAXLEN, *args)


def fail(
    t: Twin,
    client: str,
    acks: list[tuple[str, str]],
    now: int = NOW + 10,
    keep: tuple[int, int] = KEEP,
    with_f: bool = True,
    notify: int = 0,
) -> list[int]:
    args = []
    for id, token in acks:
        fid, fdata = (f"f-{id}", f'["{id}"]') if with_f else ("", "")
        args += [id, token, fid, fdata, "44", now - 5, "KeyError", "permanent", f"k {id}", "tb\n"]
    return t.both("fail", now, client, MAXLEN, *keep, "host", notify, *args, fail_queue=with_f)


# ---------------------------------------------------------------- tests


def made(t: Twin, copy: bool = True) -> dict[str, str]:
    """a..f leased by c1: a, e fresh (a with a trace), b retried once, c released once, d
    timed out once; e's lease of 4.0.0's form "<token> <leased_at>"; w delayed, x waiting."""
    dispatch(t, "a", trace=TRACE)
    dispatch(t, "b", "c", "d", "e", "f")
    dispatch(t, "w", run_at=NOW + 100_000)
    first = dequeue(t, "c1", "n1", limit=6)
    retried(t, "c1", first, {"b": "retry", "c": "release", "d": "timeout"})
    tokens = first | dequeue(t, "c1", "n2", limit=3)
    dispatch(t, "x", now=NOW + 1)
    t.r.hset(t.B4 + ":lease:c1", "e", f"{tokens['e']} {NOW}")
    if copy:
        t.to_layout5()
        t.check()  # the copy is as the comparison reads it
    return tokens


def test_finish_replies_and_stores_as_4_4_0(twin: Twin) -> None:
    tok = made(twin)
    codes = finish(
        twin,
        "c1",
        [
            ("a", tok["a"], ""),  # a no-op job: its end only
            ("b", tok["b"], '{"r": 1}'),  # failed before, with a result: kept whole
            ("c", tok["c"], ""),  # released before (no count): its end only
            ("d", tok["d"], ""),  # timed out before: kept whole with its last error
            ("e", tok["e"], '"e"'),  # a lease of 4.0.0: its numbers from the record
            ("a", tok["a"], ""),  # the same lease twice in one call: stale
            ("f", "n9.9", ""),  # another token: stale
            ("zz", "n1.1", ""),  # no lease
        ],
    )
    assert codes == [0, 0, 0, 0, 0, 1, 1, 1]
    twin.check()
    assert finish(twin, "c1", [("f", tok["f"], "[1]")], keep=(0, 0), notify=1) == [0]
    twin.check()
    assert sorted(twin.r.hkeys(twin.B5 + ":rec")) == ["w", "x"]  # the others ended


def test_finish_of_an_id_kept_whole_before_drops_that_record(twin: Twin) -> None:
    tok = made(twin, copy=False)
    assert fail(twin, "c1", [("a", tok["a"]), ("b", tok["b"])]) == [0, 0]
    dispatch(twin, "a", "b", now=NOW + 11)
    tok |= dequeue(twin, "c1", "n3", now=NOW + 11)
    twin.to_layout5()
    twin.check()
    assert finish(twin, "c1", [("a", tok["a"], ""), ("b", tok["b"], "2")], now=NOW + 12) == [0, 0]
    twin.check()


def test_retry_of_every_kind_replies_and_stores_as_4_4_0(twin: Twin) -> None:
    tok = made(twin)
    codes = retry(
        twin,
        "c1",
        [
            ("a", tok["a"], NOW + 500, "retry"),
            ("b", tok["b"], "+250", "timeout"),
            ("c", tok["c"], NOW, "stall"),
            ("d", tok["d"], NOW, "release"),
            ("e", tok["e"], NOW + 1, "return"),  # a lease of 4.0.0
            ("f", tok["f"], NOW, "bogus"),  # an unknown kind: stale, its lease kept
            ("a", tok["a"], NOW, "retry"),  # twice in one call: stale
        ],
    )
    assert codes == [0, 0, 0, 0, 0, 1, 1]
    twin.check()
    assert finish(twin, "c1", [("f", tok["f"], "")]) == [0]
    twin.check()


def test_retry_applies_a_blocked_jobs_composed_update_as_4_4_0(twin: Twin) -> None:
    dispatch(twin, "a", "b", "c", "d")
    tok = dequeue(twin, "c1", "n1")
    # blocked copies: a's composed (if_later then if_earlier, data and reset), b's a replace,
    # c's a keep without data, d none
    dispatch(twin, "a", run_at=NOW + 300, mode="if_later", tag="1", update_data=0, reset=0)
    dispatch(twin, "a", run_at=NOW + 200, mode="if_earlier", tag="2")
    dispatch(twin, "b", run_at=NOW + 700, mode="replace", tag="3", reset=0)
    dispatch(twin, "c", run_at=NOW + 900, mode="keep", tag="4", update_data=0, reset=0)
    retried(twin, "c1", tok, {"c": "release"})  # (by 4.4.0: c's blocked job merged)
    twin.to_layout5()
    twin.check()
    codes = retry(
        twin,
        "c1",
        [
            ("a", tok["a"], NOW + 100, "retry"),
            ("b", tok["b"], NOW + 100, "stall"),
            ("d", tok["d"], NOW + 100, "timeout"),
        ],
    )
    assert codes == [0, 0, 0]
    twin.check()


def test_fail_replies_and_stores_as_4_4_0(twin: Twin) -> None:
    tok = made(twin)
    assert fail(
        twin, "c1", [("a", tok["a"]), ("b", tok["b"]), ("a", tok["a"]), ("e", tok["e"])]
    ) == [0, 0, 1, 0]
    twin.check()
    assert fail(twin, "c1", [("c", tok["c"])], with_f=False) == [0]
    assert fail(twin, "c1", [("d", tok["d"])], keep=(0, 0), notify=1) == [0]
    twin.check()


def test_a_fail_job_whose_id_waits_in_the_fail_queue_is_updated_as_4_4_0(twin: Twin) -> None:
    """(Written around the library: the supervisor makes a new fail job id per failure.) A
    fail job id with a waiting job in F: its data, run_at and enqueued_at are the new ones,
    its counts and attempts stay, as 4.4.0's record hash kept its other fields."""
    tok = made(twin, copy=False)
    flags = [1, "replace", 1, TRACE]
    twin.r.fcall("q44_dispatch", 1, twin.F4, NOW, *flags, "f-a", '"old"', "")
    got = twin.r.fcall("q44_dequeue", 1, twin.F4, NOW, "c9", "m1", 1, EXPIRY, MAXLEN, 0)
    assert got[2] == "f-a"
    args = ["f-a", got[3], NOW + 9_000, "retry", "", "", "E", "m", ""]
    assert twin.r.fcall("q44_retry", 1, twin.F4, NOW, "c9", MAXLEN, *args) == [0]
    twin.to_layout5()
    assert fail(twin, "c1", [("a", tok["a"]), ("b", tok["b"])], now=NOW + 20) == [0, 0]
    twin.check()


def test_requeue_of_failed_jobs_as_4_4_0(twin: Twin) -> None:
    tok = made(twin, copy=False)
    assert fail(twin, "c1", [("a", tok["a"]), ("b", tok["b"]), ("c", tok["c"])]) == [0, 0, 0]
    # a fails again while a new a is active (its requeue: blocked), b is waiting again (kept)
    dispatch(twin, "a", now=NOW + 11)
    tok |= dequeue(twin, "c1", "n3", now=NOW + 11)
    assert "a" in tok and "x" in tok
    dispatch(twin, "b", now=NOW + 11)
    twin.to_layout5()
    twin.check()
    assert twin.both("requeue", NOW + 20, "", 10) == [3, NOW + 20, 3]
    twin.check()
    assert twin.both("requeue", NOW + 21, "", 10, "a", "b", "zz") == [0, NOW + 21, 3]
    assert retry(twin, "c1", [("a", tok["a"], NOW + 30, "retry")]) == [0]
    twin.check()


def test_cancel_as_4_4_0(twin: Twin) -> None:
    tok = made(twin, copy=False)
    assert retry(twin, "c1", [("b", tok["b"], NOW + 50_000, "retry")]) == [0]
    dispatch(twin, "a", tag="blocked")
    dispatch(twin, "a", tag="again", run_at=NOW + 5)
    twin.to_layout5()
    for id, keep in (("x", KEEP), ("w", KEEP), ("b", KEEP), ("a", KEEP), ("c", KEEP), ("zz", KEEP)):
        twin.both("cancel", NOW + 30, MAXLEN, id, *keep)
        twin.check()
    assert twin.both("cancel", NOW + 30, MAXLEN, "a", *KEEP) == 0  # the active one
    assert finish(twin, "c1", [("c", tok["c"], "")], keep=(0, 1)) == [0]
    twin.check()


def test_cancel_keeping_nothing_as_4_4_0(twin: Twin) -> None:
    made(twin)
    assert twin.both("cancel", NOW + 30, MAXLEN, "x", 0, 0) == 1
    assert twin.both("cancel", NOW + 30, 0, "w", 1, 0) == 1
    twin.check()


def test_sweep_as_4_4_0(twin: Twin) -> None:
    tok = made(twin, copy=False)
    dispatch(twin, "b", tag="blocked", mode="if_later", run_at=NOW + 40_000)
    dispatch(twin, "g")
    tok |= dequeue(twin, "c2", "m1")
    twin.to_layout5()
    twin.check()
    # c1 and c2 are dead past their expiry: a bump sweeps one per call
    assert twin.both("bump", NOW + EXPIRY + 1, "c3", EXPIRY, MAXLEN) == 0
    twin.check()
    assert twin.both("bump", NOW + EXPIRY + 2, "c3", EXPIRY, MAXLEN) == 0
    twin.check()
    assert finish(twin, "c1", [("a", tok["a"], "")]) == [1]  # a zombie's ack
    assert twin.both("bump", NOW + EXPIRY + 3, "c1", EXPIRY, MAXLEN) == 2
    twin.check()


def test_sweep_of_a_client_holding_thousands_of_leases_as_4_4_0(twin: Twin) -> None:
    """5.0 reads a dead client's leases in one HMGET and writes them back in one HSET: one
    unpack() of more than Lua's 8,000 values failed the call half-way (after the jobs'
    'stalled' events), so every later call of the queue failed so too, each writing the
    events again, and the jobs stayed leased to the dead client."""
    ids = [f"j{i}" for i in range(4_200)]
    for start in range(0, len(ids), 1000):
        dispatch(twin, *ids[start : start + 1000])
    for k in range(5):
        dequeue(twin, "c1", f"m{k}", limit=1000)
    dispatch(twin, *ids[:50], tag="blocked", mode="if_later", run_at=NOW + 40_000)
    twin.to_layout5()
    assert twin.both("bump", NOW + EXPIRY + 1, "c3", EXPIRY, MAXLEN) == 0
    twin.check()
    assert twin.both("counts", NOW + EXPIRY + 1)[:4] == [len(ids) - 50, 50, 0, 0]


def test_purge_as_4_4_0(twin: Twin) -> None:
    tok = made(twin, copy=False)
    assert finish(twin, "c1", [("b", tok["b"], "")]) == [0]
    dispatch(twin, "a", tag="blocked")
    twin.to_layout5()
    for state in ("waiting", "delayed", "blocked", "finished", "cancelled"):
        twin.both("purge", NOW + 30, state, 100, 1)
        twin.check()
    assert twin.both("purge", NOW + 30, "active", 100) is not None


def test_finish_and_fail_promote_a_blocked_job_as_4_4_0(twin: Twin) -> None:
    """A blocked job (composed updates) becomes waiting when its active one ends: the
    promotion (l5-a1's promote()) runs after the ended records left B:rec."""
    dispatch(twin, "a", "b", "c")
    tok = dequeue(twin, "c1", "n1")
    dispatch(twin, "a", run_at=NOW + 300, mode="if_later", tag="1", update_data=0, reset=0)
    dispatch(twin, "a", run_at=NOW + 200, mode="if_earlier", tag="2")
    dispatch(twin, "b", run_at=NOW + 700, tag="3")
    dispatch(twin, "c", run_at=NOW + 900, tag="4")
    twin.to_layout5()
    assert finish(twin, "c1", [("a", tok["a"], ""), ("b", tok["b"], "[2]")]) == [0, 0]
    twin.check()
    assert fail(twin, "c1", [("c", tok["c"])]) == [0]
    twin.check()
    assert twin.both("cancel", NOW + 30, MAXLEN, "c", *KEEP) == 1  # waiting now
    twin.check()


def test_the_end_of_a_schedules_occurrence_is_noted_as_4_4_0(twin: Twin) -> None:
    assert twin.old("schedule", NOW, "every 1s", "", NOW, "", 0, 0)[0] == 2
    tok = dequeue(twin, "c1", "n1", now=NOW)
    assert list(tok) == ["schedule"]
    twin.to_layout5()
    assert finish(twin, "c1", [("schedule", tok["schedule"], "")]) == [0]
    twin.check()


# ---------------------------------------------------------------- cost (issue 14)

#: commands sent by the test itself between its two looks, not run inside an FCALL
OUTSIDE = {"fcall", "info"}


def commands(r: redis.Redis) -> dict[str, int]:
    stats = r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def active(r: redis.Redis, B: str, n: int, client: str = "c1") -> list[str]:
    """n active no-op jobs of `client` written in 5.0's layout (as a dequeue leaves them):
    returns the finish ARGV of their acks."""
    ids = [f"j{i}" for i in range(n)]
    r.hset(B + ":rec", mapping={id: f"{NOW} {NOW} 0 0 0 0\t\t1" for id in ids})
    r.hset(B + ":lease:" + client, mapping={id: f"t.{id} {NOW} {NOW} 0 0 0 1 {NOW}" for id in ids})
    r.zadd(B + ":expiry", {client: NOW + EXPIRY})
    r.set(B + ":layout", "5")  # (the upgrade's mark: a queue in 5.0's layout)
    return [x for id in ids for x in (id, f"t.{id}", "42", NOW + 1, "")]


def test_finish_of_no_op_jobs_runs_no_command_per_job_but_its_event(twin: Twin) -> None:
    """A no-op job (no result, no earlier failed attempt) costs finish its event's XADD
    only: the leases and the records (B:rec) go in one HDEL each per call, whatever the
    number of jobs (and the last errors of jobs leased before, B:err)."""
    ran = {}
    for n in (10, 40):
        B = f"{twin.B5}{n}"
        acks = active(twin.r, B, n)
        before = commands(twin.r)
        head = [NOW + 5, "c1", MAXLEN, *KEEP, "h", 0]
        assert twin.r.fcall("queasy_finish", 1, B, *head, *acks) == [0] * n
        after = commands(twin.r)
        ran[n] = {k: v - before.get(k, 0) for k, v in after.items() if k not in OUTSIDE}
        ran[n] = {k: v for k, v in ran[n].items() if v}
        assert twin.r.exists(B + ":rec", B + ":lease:c1") == 0
        assert twin.r.hlen(B + ":ends") == n and twin.r.xlen(B + ":events") == n
    assert ran[10]["xadd"] == 10 and ran[40]["xadd"] == 40
    assert {k: v for k, v in ran[10].items() if k != "xadd"} == {
        k: v for k, v in ran[40].items() if k != "xadd"
    }
    # the leases, the records (a job leased once has no last error: no HDEL of B:err)
    assert ran[10]["hdel"] == 2
    assert ran[10]["hmget"] == 3  # the leases, the records, the stats
    assert ran[10]["exists"] == 1  # the migration guard's, with B:blocked


# ---------------------------------------------------------------- garbled around the library


def test_a_value_garbled_around_the_library_fails_no_call(twin: Twin) -> None:
    """A B:rec value that is not a record string, a B:blocked value that is not one: the
    acks go on as 4.x went on with garbage fields (numbers 0), nothing fails half-way."""
    r, B = twin.r, twin.B5
    acks = active(r, B, 4)
    r.hset(B + ":rec", mapping={"j0": "garbage", "j1": "x y", "j2": "1 2\t\t3", "j3": "junk"})
    r.hset(B + ":lease:c1", "j1", f"t.j1 {NOW}")  # a lease of 4.0.0: the record's numbers
    head = [NOW + 5, "c1", MAXLEN, *KEEP, "h", 0]
    # j0: its lease's numbers; j1: a lease of 4.0.0 on a garbled record reads numbers 0
    assert r.fcall("queasy_finish", 1, B, *head, *acks[:10]) == [0, 0]
    r.hset(B + ":blocked", mapping={"j2": "no tab", "j3": "1 1 replace - -\tnot a record"})
    retry_args = [
        x for id in ("j2", "j3") for x in (id, f"t.{id}", NOW, "retry", "", "", "E", "m", "")
    ]
    assert r.fcall("queasy_retry", 1, B, NOW + 6, "c1", MAXLEN, *retry_args) == [0, 0]
    lines = [f["event"] for _, f in r.xrange(B + ":events")]
    assert lines[0] == f"finished j0 {NOW + 5} {NOW + 1} 42 {NOW} {NOW} 0 0 0 c1"
    assert lines[1] == f"finished j1 {NOW + 5} {NOW + 1} 42 0 - 0 0 0 c1"
    assert lines[2] == f"retried j2 {NOW + 6} - - 0 - 1 0 0 c1"
    # requeued with what could be read; the blocked values that are no job are dropped
    assert r.hget(B + ":rec", "j2") == f"{NOW} - 1 0 0 1\t\t3"
    assert r.hget(B + ":rec", "j3") == f"{NOW} - 1 0 0 1\t\t"
    assert r.exists(B + ":blocked") == 0
    assert r.zrange(B + ":waiting", 0, -1) == ["j2", "j3"]
    assert r.fcall("queasy_cancel", 1, B, NOW, MAXLEN, "j2", *KEEP) == 1
