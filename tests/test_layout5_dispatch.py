"""Library 5.0's dispatch family and dequeue on the one-hash layout (B:rec, B:blocked as a
hash), against library 4.4.0 (tests/fixtures/queasy-4.4.0.lua, loaded on a second embedded
server): the same calls give the same replies, push messages and leases, and leave the same
jobs (a 4.x record read field by field, a 5.0 one split from its string).

And what only 5.0 has: a dispatch of new ids writes fields of B:rec and no key per job, a
dequeue leaves the record in B:rec, and a value of B:rec garbled around the library does not
fail a call.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from lua_calls import EXPIRY, NOW, Lua

from queasy_py.store.embedded import EmbeddedServer
from queasy_py.store.library import source

FIXTURES = Path(__file__).parent / "fixtures"
COUNTS = ("retry_count", "stall_count", "timeout_count", "attempts")
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def old(own_server: EmbeddedServer, prefix: str) -> Iterator[Lua]:
    """Library 4.4.0 on a server of its own, on the same prefix."""
    conn = redis.Redis.from_url(own_server.url, decode_responses=True)
    conn.function_load((FIXTURES / "queasy-4.4.0.lua").read_text(), replace=True)
    assert conn.fcall("queasy_library", 0) == "queasy_py 4.4.0"
    try:
        yield Lua(conn, prefix)
    finally:
        for key in conn.scan_iter(match=f"{prefix}:*", count=1000):
            conn.unlink(key)
        conn.close()


# ---------------------------------------------------------------- the jobs, layout-neutral


def split(value: str) -> dict[str, str]:
    """A 5.0 record string as 4.x's record fields."""
    nums, trace, data = value.split("\t", 2)
    run_at, enqueued, retry, stall, timeout, attempts = nums.split(" ")
    return {
        "data": data, "run_at": run_at, "enqueued_at": enqueued, "retry_count": retry,
        "stall_count": stall, "timeout_count": timeout, "attempts": attempts, "trace": trace,
    }  # fmt: skip


def fields4(h: dict[str, str]) -> dict[str, str]:
    """A 4.x record hash as split() gives a 5.0 one (an absent count is 0, a trace '')."""
    out = {name: h.get(name, "0") for name in COUNTS}
    out |= {"data": h["data"], "run_at": h["run_at"], "enqueued_at": h["enqueued_at"]}
    return out | {"trace": h.get("trace", "")}


def update4(h: dict[str, str]) -> tuple[str, ...]:
    """The composed update flags of a 4.x blocked record, as 5.0 writes them."""
    bound = [h["u_lo"] or "-", h["u_hi"] or "-"]
    return (h["u_data"], h["u_reset"], h["u_run_at"], *bound)


def state4(lua: Lua, clients: list[str]) -> dict[str, Any]:
    r, B = lua.r, lua.B
    waiting = dict(r.zrange(B + ":waiting", 0, -1, withscores=True))
    blocked = {}
    for id in r.smembers(B + ":blocked"):
        h = r.hgetall(f"{B}:job:{id}")
        blocked[id] = (update4(h), fields4(h))
    out = {
        "waiting": {
            id: (score, fields4(r.hgetall(f"{B}:job:{id}"))) for id, score in waiting.items()
        },
        "blocked": blocked,
        "active": {k[len(B) + 8 :]: fields4(r.hgetall(k)) for k in r.scan_iter(f"{B}:active:*")},
    }
    return out | common(lua, clients)


def state5(lua: Lua, clients: list[str]) -> dict[str, Any]:
    r, B = lua.r, lua.B
    waiting = dict(r.zrange(B + ":waiting", 0, -1, withscores=True))
    recs = {id: split(v) for id, v in r.hgetall(B + ":rec").items()}
    blocked = {}
    for id, v in r.hgetall(B + ":blocked").items():
        flags, rest = v.split("\t", 1)
        blocked[id] = (tuple(flags.split(" ")), split(rest))
    assert r.type(B + ":blocked") in ("hash", "none")
    assert not list(r.scan_iter(f"{B}:job:*")) and not list(r.scan_iter(f"{B}:active:*"))
    out = {
        "waiting": {id: (score, recs[id]) for id, score in waiting.items()},
        "blocked": blocked,
        "active": {id: rec for id, rec in recs.items() if id not in waiting},
    }
    return out | common(lua, clients)


def lease_key(value: str) -> tuple[str, str]:
    """A lease as (token, leased_at): library 5.1.0 writes "<token> <leased_at>", 4.4.0 the
    numbers of the record between them (which 5.1.0's ack reads from the record)."""
    words = value.split(" ")
    return words[0], words[-1]


def common(lua: Lua, clients: list[str]) -> dict[str, Any]:
    """What both layouts keep alike: leases (as lease_key), parked slots, windows, the push
    counter."""
    r, B = lua.r, lua.B
    windows = {k[len(B) :]: r.hgetall(k) for k in r.scan_iter(f"{B}:window:*")}
    once = {k[len(B) :]: r.get(k) for k in r.scan_iter(f"{B}:once:*")}
    return {
        "leases": {
            c: {id: lease_key(v) for id, v in r.hgetall(f"{B}:lease:{c}").items()} for c in clients
        },
        "parked": r.hgetall(B + ":parked"),
        "windows": {k: v for k, v in windows.items() if v},  # (not expired since the scan)
        "index": r.zrange(B + ":windows", 0, -1, withscores=True),
        "once": {k: v for k, v in once.items() if v is not None},
        "seq": r.get(B + ":seq"),
        "expiry": r.zrange(B + ":expiry", 0, -1, withscores=True),
    }


class Pushes:
    """A subscriber of the push channels of `clients` (and B:wake), on one server."""

    def __init__(self, url: str, lua: Lua, clients: list[str]) -> None:
        self.conn = redis.Redis.from_url(url, decode_responses=True)
        self.pubsub = self.conn.pubsub(ignore_subscribe_messages=True)
        self.B = lua.B
        self.pubsub.ssubscribe(
            lua.B + ":wake", lua.B + ":end", *[f"{lua.B}:push:{c}" for c in clients]
        )

    def messages(self) -> list[tuple[str, str]]:
        self.conn.spublish(self.B + ":end", "")  # delivered after every earlier message
        out: list[tuple[str, str]] = []
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=1.0)
            if message is None:
                continue
            channel = message["channel"]
            channel = channel.decode() if isinstance(channel, bytes) else channel
            if channel == self.B + ":end":
                return out
            data = message["data"]
            out.append((channel[len(self.B) :], data.decode() if isinstance(data, bytes) else data))
        raise AssertionError("the end mark did not come back")

    def close(self) -> None:
        self.pubsub.close()
        self.conn.close()


# ---------------------------------------------------------------- the same calls on both


def both(lua: Lua, old: Lua, name: str, *args: Any, seen: set[Any] | None = None) -> Any:
    new_reply = lua.call(name, [lua.B], *args)
    old_reply = old.call(name, [old.B], *args)
    assert new_reply == old_reply, (name, args)
    if seen is not None and name == "queasy_dequeue":
        seen.add((name, len(new_reply) > 2))
    elif seen is not None:
        seen.update(
            (name, code) for code in (new_reply if isinstance(new_reply, list) else [new_reply])
        )
    return new_reply


def random_calls(
    lua: Lua, old: Lua, seed: int, steps: int, seen: set[Any], urls: tuple[str, str] | None = None
) -> None:
    push = urls is not None
    rnd = random.Random(seed)
    ids = [f"j{k}" for k in range(6)] + ["schedule"]
    clients = ["c1", "c2"]
    subs = [Pushes(urls[0], lua, clients), Pushes(urls[1], old, clients)] if push else []
    now, nonce = NOW, 0
    try:
        for step in range(steps):
            now += rnd.choice([0, 0, 1, 7, 500])
            op = rnd.random()
            if op < 0.45 or op >= 0.9:
                triples: list[Any] = []
                for _ in range(rnd.choice([1, 1, 2, 3, 5])):
                    run_at = rnd.choice(["", now, now - 3, now + 40, now + 900, now + 7])
                    triples += [rnd.choice(ids), f'{{"s": {step}}}', run_at]
                flags = [
                    rnd.choice("01"),
                    rnd.choice(["replace", "keep", "if_later", "if_earlier"]),
                ]
                flags.append(rnd.choice("01"))
                if op < 0.35:
                    both(
                        lua,
                        old,
                        "queasy_dispatch",
                        now,
                        *flags,
                        rnd.choice(["", TRACE]),
                        *triples,
                        seen=seen,
                    )
                elif op < 0.45:
                    both(
                        lua,
                        old,
                        "queasy_dispatch_once",
                        now,
                        *flags,
                        rnd.choice([1000, 3000]),
                        *triples,
                        seen=seen,
                    )
                else:
                    run_at = rnd.choice(["", now - 3])
                    id = rnd.choice(ids)
                    both(
                        lua,
                        old,
                        "queasy_dispatch_letter",
                        now,
                        rnd.choice(["", TRACE]),
                        id,
                        '"l"',
                        run_at,
                        seen=seen,
                    )
            elif op < 0.85:
                nonce += 1
                park = rnd.choice(["1", "0", "0"]) if push else "0"
                client = rnd.choice(clients)
                limit = rnd.choice([0, 1, 2, 10])
                args = [now, client, f"n{nonce}", limit, EXPIRY, 100, park]
                both(lua, old, "queasy_dequeue", *args, seen=seen)
            else:
                client = rnd.choice(clients)
                both(lua, old, "queasy_bump", now, client, EXPIRY, 100)
            new_state, old_state = state5(lua, clients), state4(old, clients)
            for name in ("windows", "once"):  # keys that expire on the servers' own clocks
                both_have = new_state[name].keys() & old_state[name].keys()
                new_state[name] = {k: new_state[name][k] for k in both_have}
                old_state[name] = {k: old_state[name][k] for k in both_have}
            assert new_state == old_state, step
        if push:
            messages = subs[0].messages()
            assert messages == subs[1].messages()
            seen.update(
                ("pushed", channel) for channel, _ in messages if channel.startswith(":push:")
            )
    finally:
        for sub in subs:
            sub.close()


def test_dispatch_and_dequeue_reply_and_store_as_4_4_0(lua: Lua, old: Lua, prefix: str) -> None:
    """Random batches of dispatch, dispatch_once, dispatch_letter, dequeue and bump over a few
    ids (duplicates in a batch, delayed jobs, every run_at mode and flag, active ids that
    block and compose their updates), one queue per seed: every reply, and the jobs left,
    as 4.4.0's; the calls went through every code of every function."""
    seen: set[Any] = set()
    for seed in range(8):
        queue = f"q{seed}"
        random_calls(Lua(lua.r, prefix, queue), Lua(old.r, prefix, queue), seed, 120, seen)
    dispatched = {("queasy_dispatch", code) for code in (1, 2, 3, 4)}
    once = {("queasy_dispatch_once", code) for code in (1, 2, 5)}
    letter = {("queasy_dispatch_letter", code) for code in (1, 5)}
    dequeued = {("queasy_dequeue", True), ("queasy_dequeue", False)}
    assert dispatched | once | letter | dequeued <= seen


def test_pushes_to_parked_clients_as_4_4_0(
    lua: Lua, old: Lua, prefix: str, redis_url: str, own_server: EmbeddedServer
) -> None:
    """With listening clients that park: the pushed messages, their leases and parked
    slots as 4.4.0's."""
    seen: set[Any] = set()
    for seed in range(4):
        queue = f"p{seed}"
        urls = (redis_url, own_server.url)
        random_calls(
            Lua(lua.r, prefix, queue), Lua(old.r, prefix, queue), 100 + seed, 120, seen, urls
        )
    assert {("pushed", ":push:c1"), ("pushed", ":push:c2")} <= seen


def test_a_blocked_dispatch_composes_its_updates_as_4_4_0(lua: Lua, old: Lua) -> None:
    for side in (lua, old):
        side.add("a", '"one"')
        assert side.dequeue("c1", limit=1).ids == ["a"]
    steps = [
        ("0", "if_later", "0", NOW + 50),
        ("1", "if_earlier", "0", NOW + 20),
        ("0", "keep", "1", NOW + 90),
        ("0", "if_later", "0", NOW + 30),
        ("1", "replace", "0", NOW + 70),
        ("0", "if_earlier", "0", NOW + 10),
    ]
    codes = []
    for k, (update, mode, reset, run_at) in enumerate(steps):
        args = [NOW + k, update, mode, reset, "", "a", f'"v{k}"', run_at]
        codes.append(both(lua, old, "queasy_dispatch", *args)[0])
        assert state5(lua, ["c1"]) == state4(old, ["c1"])
    assert codes == [3, 4, 4, 4, 4, 4]


# ---------------------------------------------------------------- the 5.0 layout itself


def test_a_dispatch_of_new_ids_writes_fields_of_one_hash(lua: Lua) -> None:
    n = 50
    triples = [(f"id{k}", f'{{"k": {k}}}', "") for k in range(n)]
    assert lua.dispatch(*triples, trace=TRACE) == [1] * n
    recs = lua.r.hgetall(lua.B + ":rec")
    assert len(recs) == n
    assert split(recs["id7"]) == {
        "data": '{"k": 7}', "run_at": str(NOW), "enqueued_at": str(NOW), "retry_count": "0",
        "stall_count": "0", "timeout_count": "0", "attempts": "0", "trace": TRACE,
    }  # fmt: skip
    keys = {key for key in lua.r.keys(lua.B + ":*") if key != lua.B + ":layout"}  # (its mark)
    assert keys == {lua.B + ":rec", lua.B + ":waiting"}  # no key per job


def test_a_dequeue_leaves_the_record_in_place_and_leases_it(lua: Lua) -> None:
    lua.dispatch(("a", '"x"', ""), ("b", '"y"', NOW + 10))
    before = lua.r.hgetall(lua.B + ":rec")
    checkout = lua.dequeue("c1", limit=5)
    assert checkout.ids == ["a"] and checkout.next_run_at == str(NOW + 10)
    assert lua.r.hgetall(lua.B + ":rec") == before  # nothing moved, nothing rewritten
    assert lua.r.zrange(lua.B + ":waiting", 0, -1) == ["b"]
    token = checkout.jobs[0].token
    assert lua.r.hgetall(lua.B + ":lease:c1") == {"a": f"{token} {NOW}"}  # (5.1.0's form)
    assert lua.add("a", '"z"') == 3  # active: a blocked job waits for it
    assert lua.r.hget(lua.B + ":blocked", "a") == f'1 1 replace - -\t{NOW} {NOW} 0 0 0 0\t\t"z"'


def test_a_dequeue_takes_counts_and_attempts_from_the_record_and_its_ack_too(lua: Lua) -> None:
    """The reply has the record's numbers; the lease (5.1.0) its token and time only, and the
    finish takes the numbers of its event and end from the record (4.1.0 to 5.0.0: from the
    lease)."""
    lua.r.hset(lua.B + ":rec", "a", f"{NOW} {NOW - 9} 2 1 3 4\t{TRACE}\t" + '"d a t a"')
    lua.r.zadd(lua.B + ":waiting", {"a": NOW})
    job = lua.dequeue("c1", limit=1).jobs[0]
    assert (job.data, job.run_at, job.retry_count, job.stall_count, job.timeout_count) == (
        '"d a t a"', NOW, 2, 1, 3)  # fmt: skip
    assert job.trace == TRACE
    assert lua.r.hget(lua.B + ":lease:c1", "a") == f"{job.token} {NOW}"
    assert lua.finish("c1", job, now=NOW + 7) == 0
    end = lua.r.hget(lua.B + ":ends", "a").split(" ")
    assert end[4:10] == ["5", str(NOW), str(NOW - 9), "2", "1", "3"], end  # attempts, numbers


def test_a_record_upgraded_without_enqueued_at_gets_a_lease_of_4_0_0(lua: Lua) -> None:
    lua.r.hset(lua.B + ":rec", "a", f"{NOW} - 0 0 0 0\t\t1")
    lua.r.zadd(lua.B + ":waiting", {"a": NOW})
    job = lua.dequeue("c1", limit=1).jobs[0]
    assert lua.r.hget(lua.B + ":lease:c1", "a") == f"{job.token} {NOW}"


@pytest.mark.parametrize(
    ("value", "served"),
    [
        ("garbage", None),  # not a record: dropped, as 4.x drops a stray id
        ("", None),
        ("x y\t", None),
        (f"x {NOW} 1e+300 -1 z 0\t\t7", ("7", 0, 0, 0, 0)),  # numbers read as 0, as 4.x
        ("1 2 3\t\t8", ("8", 0, 0, 0, 0)),  # too few numbers
        (f"{NOW} {NOW} 0 0 0 0 0\t\t9", ("9", 0, 0, 0, 0)),  # too many
        (f"{NOW}\t{NOW} 0 0 0 0\t\t10", ("\t10", 0, 0, 0, 0)),  # a tab among them: the
        # numbers end at the first tab, the trace at the second
    ],
)
def test_a_garbled_record_does_not_fail_a_dequeue(
    lua: Lua, value: str, served: tuple | None
) -> None:
    lua.r.hset(lua.B + ":rec", "bad", value)
    lua.r.zadd(lua.B + ":waiting", {"bad": NOW - 1})
    lua.add("ok", '"fine"')
    checkout = lua.dequeue("c1", limit=5)
    assert checkout.status == 0
    assert lua.r.zrange(lua.B + ":waiting", 0, -1) == []
    jobs = {job.id: job for job in checkout.jobs}
    assert jobs["ok"].data == '"fine"'
    if served is None:
        assert list(jobs) == ["ok"]
        assert lua.r.hget(lua.B + ":rec", "bad") is None  # the id is free again
        assert lua.add("bad", '"new"') == 1
    else:
        job = jobs["bad"]
        assert (job.data, job.run_at, job.retry_count, job.stall_count, job.timeout_count) == served
        assert lua.r.hget(lua.B + ":rec", "bad") == value  # as it was: leased as it is


@pytest.mark.parametrize("value", ["garbage", f"{NOW} x 0 0 0 0\t\t1", "1 1 keep\t\t\t"])
def test_a_garbled_record_or_blocked_value_does_not_fail_a_dispatch(lua: Lua, value: str) -> None:
    lua.r.hset(lua.B + ":rec", "w", value)  # in B:waiting: written over
    lua.r.zadd(lua.B + ":waiting", {"w": NOW})
    lua.r.hset(lua.B + ":rec", "a", f"{NOW} {NOW} 0 0 0 0\t\t1")  # active: blocks
    lua.r.hset(lua.B + ":blocked", "a", value)
    codes = lua.dispatch(("w", '"w"', ""), ("a", '"a"', NOW + 5), ("a", '"b"', NOW + 6))
    assert codes[0] in (1, 2) and codes[1:] in ([3, 4], [4, 4])
    assert split(lua.r.hget(lua.B + ":rec", "w"))["data"] == '"w"'
    flags, rec = lua.r.hget(lua.B + ":blocked", "a").split("\t", 1)
    assert split(rec)["data"] == '"b"'


def test_schedule_creates_moves_and_sees_its_occurrence_as_4_4_0(lua: Lua, old: Lua) -> None:
    """queasy_schedule and queasy_unschedule read the occurrence from B:rec: created, moved
    while it waits, kept while it is leased (active), a dispatch of its id refused; every
    reply and the occurrence's record as 4.4.0's."""
    s = NOW + 1_000

    def sched(seen: Any, create_at: Any, retime_at: Any = "", now: int = NOW) -> Any:
        return both(lua, old, "queasy_schedule", now, "every 1s", seen, create_at, retime_at, 2, 3)

    assert both(lua, old, "queasy_unschedule", NOW) == [0, ""]
    assert sched("", s) == [2, str(s), "every 1s", "", "waiting"]
    assert sched("", s + 1) == [1, str(s), "every 1s", "", "waiting"]  # stale
    assert sched(s, s + 1_000) == [0, str(s), "every 1s", "", "waiting"]
    assert sched(s, s + 1_000, s + 500) == [3, str(s + 500), "every 1s", "", "waiting"]
    assert state5(lua, []) == state4(old, [])
    assert both(lua, old, "queasy_unschedule", NOW) == [2, "waiting"]
    with pytest.raises(redis.ResponseError, match="reserved"):
        lua.add("schedule", '"x"')
    now = s + 500
    dequeue = [now, "c1", "n1", 5, EXPIRY, 100, "0"]
    assert both(lua, old, "queasy_dequeue", *dequeue)[2] == "schedule"
    assert sched(s + 500, s + 1_000, s + 2_000, now) == [0, str(s + 500), "every 1s", "", "active"]
    assert both(lua, old, "queasy_unschedule", now) == [2, "active"]
    assert state5(lua, ["c1"]) == state4(old, ["c1"])


PROBE = """
redis.register_function('queasy_probe_promote', entry(function(keys, args)
  -- ARGV: now, id, any_blocked ('1'|'0'); the active record ends first (as finish, fail)
  call('HDEL', keys[1] .. ':rec', args[2])
  return promote(keys[1], args[2], args[3] == '1') and 1 or 0
end))
"""


@pytest.fixture
def probe(r: redis.Redis, redis_url: str, prefix: str) -> Iterator[Lua]:
    """This library with one more function, which ends an active job as finish and fail end
    it and calls promote (the library's own code, which l5-a2's finish and fail call); the
    library alone is loaded back after the test."""
    with redis.Redis.from_url(redis_url) as conn:
        conn.function_load(source() + PROBE, replace=True)
    try:
        yield Lua(r, prefix)
    finally:
        with redis.Redis.from_url(redis_url) as conn:
            conn.function_load(source(), replace=True)


@pytest.mark.parametrize(
    "flags", [("1", "if_later", "1"), ("0", "keep", "0"), ("1", "if_earlier", "0")]
)
def test_promote_makes_the_blocked_job_waiting_as_4_4_0(
    old: Lua, probe: Lua, redis_url: str, flags: tuple[str, str, str]
) -> None:
    """The blocked job of an id that ends becomes its waiting record, at its own run_at, as
    4.4.0's finish promotes it (its record field by field; B:blocked left empty)."""
    tokens = []
    for side in (probe, old):
        side.add("a", '"one"')
        tokens.append(side.dequeue("c1", limit=1).jobs[0].token)
        assert side.dispatch(("a", '"two"', NOW + 40), trace=TRACE) == [3]
        args = [NOW + 1, *flags, "", "a", '"three"', NOW + 20]
        assert side.call("queasy_dispatch", [side.B], *args) == [4]
    head = [NOW + 2, "c1", 100, 10, 3_600_000, "h", 0]
    assert old.call("queasy_finish", [old.B], *head, "a", tokens[1], "", "", "") == [0]
    pushes = Pushes(redis_url, probe, [])
    try:
        assert probe.call("queasy_probe_promote", [probe.B], NOW + 2, "a", "1") == 1
        assert probe.call("queasy_probe_promote", [probe.B], NOW + 2, "b", "1") == 0  # none
        run_at = int(old.r.zscore(old.B + ":waiting", "a") or 0)  # (4.4.0's)
        assert pushes.messages() == [(":wake", str(run_at))]
    finally:
        pushes.close()
    assert state5(probe, [])["waiting"] == state4(old, [])["waiting"]
    assert probe.r.exists(probe.B + ":blocked") == 0
    assert split(probe.r.hget(probe.B + ":rec", "a"))["trace"] == TRACE


def test_promote_drops_a_blocked_value_that_is_not_a_record(probe: Lua) -> None:
    probe.r.hset(probe.B + ":blocked", "a", "1 1 replace - -\tgarbage")
    assert probe.call("queasy_probe_promote", [probe.B], NOW, "a", "1") == 0
    assert probe.r.exists(probe.B + ":blocked", probe.B + ":rec", probe.B + ":waiting") == 0
    probe.r.hset(probe.B + ":blocked", "b", f"1 1 replace - -\t{NOW} {NOW} 0 0 0 0\t\t1")
    assert probe.call("queasy_probe_promote", [probe.B], NOW, "b", "0") == 0  # any_blocked false
    assert probe.r.hlen(probe.B + ":blocked") == 1


def test_a_waiting_entry_of_an_id_with_a_blocked_job_is_not_leased_again(lua: Lua) -> None:
    """An id with a blocked job is active (a blocked job waits only behind an active one):
    an entry of it in B:waiting (written around the library) is dropped, and its record is
    not leased to a second client (4.x: the record had moved to B:active:<id>, and dequeue's
    RENAMENX failed)."""
    active = lua.take("a", client="c1")
    assert lua.add("a", '"blocked"') == 3
    lua.r.zadd(lua.B + ":waiting", {"a": NOW})
    lua.add("b")
    assert lua.dequeue("c2", limit=5).ids == ["b"]
    assert lua.r.hget(lua.B + ":lease:c1", "a") == f"{active.token} {NOW}"
    assert not lua.r.hexists(lua.B + ":lease:c2", "a")
    assert lua.r.zrange(lua.B + ":waiting", 0, -1) == []
    assert split(lua.r.hget(lua.B + ":rec", "a"))["data"] == '"x"'  # the active record stays
