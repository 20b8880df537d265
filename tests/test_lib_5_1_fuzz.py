"""Library 5.1.0 against 5.0.0 (tests/fixtures/queasy-5.0.0.lua, loaded beside it as q50_*)
on records garbled around the library, drawn at random (a fixed seed): leading zeros, numbers
of 15 and 16 digits, past MAX_MS, empty, '-', words, signs, exponents; too few or too many
numbers, doubled spaces, a tab among them; traces of 256 and 257 bytes, odd characters; data
with tabs, newlines, non-UTF-8 bytes or nothing. The same calls (dequeue, then finish, finish
with a result, fail, retry, or the sweep of the client) run three ways: 5.0.0 alone, 5.1.0
alone, and leased by 5.0.0 then acked by 5.1.0 (a lease of 4.1.0's form); the dequeue's
replies (8 values per job), the reads of the active jobs (get_job, jobs 'active', leases) and
every key written after the ack must be the same, byte for byte."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from queasy_py.store.keys import QueueKeys
from queasy_py.store.library import source

FIXTURE = Path(__file__).parent / "fixtures" / "queasy-5.0.0.lua"
NOW = 1_700_000_000_000
NUMS = ["0", "00", "007", "1", "5", str(NOW), "9" * 15, "9" * 16, "1" * 16, "", "-", "x",
        "1e3", "-1", "+5", "0x10", "1.5", "253402300799999", "253402300800000"]  # fmt: skip
TRACES = ["", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "a" * 256, "a" * 257,
          "odd \x01 ch", "a b"]  # fmt: skip
DATA = [b'"x"', b'"a\tb\nc"', b"", b"\t", b"\xff\xfe", b'{"k": "\n"}']
WAYS = [("q50_", "q50_"), ("queasy_", "queasy_"), ("q50_", "queasy_")]


@pytest.fixture(scope="module")
def r(own_server: Any) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(own_server.url)  # bytes: data that is not UTF-8
    old = FIXTURE.read_text()
    old = old.replace("#!lua name=queasy\n", "#!lua name=queasy50\n", 1)
    old = old.replace("register_function('queasy_", "register_function('q50_")
    old = old.replace("function_name = 'queasy_", "function_name = 'q50_")
    conn.function_load(source(), replace=True)
    conn.function_load(old, replace=True)
    try:
        yield conn
    finally:
        conn.close()


def record(rng: random.Random) -> bytes:
    n = rng.choice([6] * 8 + [5, 7, 1, 0])
    nums = [
        rng.choice(NUMS) if rng.random() < 0.35 else rng.choice(["0", str(NOW), "3"])
        for _ in range(n)
    ]
    head = rng.choice([" "] * 10 + ["  ", "\t"]).join(nums).encode()
    k = rng.random()
    if k < 0.05:
        return head  # no tab: not a record
    if k < 0.1:
        return head + b"\t" + rng.choice(DATA)
    return head + b"\t" + rng.choice(TRACES).encode() + b"\t" + rng.choice(DATA)


def stored(r: redis.Redis, B: bytes) -> dict[bytes, Any]:
    out: dict[bytes, Any] = {}
    for key in r.scan_iter(match=B + b":*", count=1000):
        kind = r.type(key)
        if kind == b"hash":
            out[key[len(B) :]] = r.hgetall(key)
        elif kind == b"zset":
            out[key[len(B) :]] = r.zrange(key, 0, -1, withscores=True)
        elif kind == b"stream":
            out[key[len(B) :]] = [fields for _, fields in r.xrange(key)]
        else:
            out[key[len(B) :]] = r.get(key)
    return out


def run(r: redis.Redis, n: int, way: tuple[str, str], recs: dict[bytes, bytes], kind: str) -> Any:
    dq, ack = way
    B = QueueKeys(f"fz{n}-{dq}{ack}", "q", "q").base.encode()
    r.set(B + b":layout", "5")
    r.hset(B + b":rec", mapping=recs)  # type: ignore[arg-type]
    r.zadd(B + b":waiting", {id: NOW + i for i, id in enumerate(recs)})
    row = r.fcall(dq + "dequeue", 1, B, NOW + 100, "c1", "n", 20, 60_000, 1000)
    reads = [
        [r.fcall(lib + "get_job", 1, B, NOW + 300, id) for id in recs]
        + [r.fcall(lib + "jobs", 1, B, NOW + 300, "active", "0", 100, 1)]
        + [r.fcall(lib + "leases", 1, B, NOW + 300, "c1")]
        for lib in ("queasy_", "q50_")
    ]
    leases = [(row[k], row[k + 1]) for k in range(2, len(row), 8)]
    now = NOW + 500
    reply = None
    if kind == "sweep":
        reply = r.fcall(ack + "bump", 1, B, NOW + 100_000, "c2", 60_000, 1000)
    elif leases and kind == "retry":
        flat = [x for id, t in leases for x in (id, t, now + 10, "retry", 42, NOW + 200, "E",
                                                 "m", "tb")]  # fmt: skip
        reply = r.fcall(ack + "retry", 1, B, now, "c1", 1000, *flat)
    elif leases:
        head = [now, "c1", 1000, 100, 3_600_000, "host one", 0]
        if kind == "fail":
            flat = [x for id, t in leases for x in (id, t, "", "", 42, NOW + 200, "E", "k", "m",
                                                     "tb")]  # fmt: skip
        else:
            result = '{"r": 1}' if kind == "result" else ""
            flat = [x for id, t in leases for x in (id, t, 42, NOW + 200, result)]
        name = "fail" if kind == "fail" else "finish"
        reply = r.fcall(ack + name, 1, B, *head, *flat)
    after = stored(r, B)
    after.pop(b":lease:c1", None)  # (compared through the reads: the forms differ)
    # the dequeue's reply without its tokens (each library's nonce counter is its own)
    jobs = [row[k : k + 1] + row[k + 2 : k + 8] for k in range(2, len(row), 8)]
    return row[:2], jobs, reads, reply, after


@pytest.mark.parametrize("seed", range(4))
def test_garbled_records_give_what_5_0_0_gives_whoever_leased_and_acked(
    r: redis.Redis, seed: int
) -> None:
    rng = random.Random(seed)
    for n in range(40):
        recs = {f"j{i}".encode(): record(rng) for i in range(6)}
        kind = rng.choice(["finish", "result", "fail", "retry", "sweep"])
        results = [run(r, seed * 1000 + n, way, recs, kind) for way in WAYS]
        for way, got in zip(WAYS[1:], results[1:], strict=True):
            assert got == results[0], (way, kind, recs)


#: leases as 3.x (the token alone), 4.0.0 and 5.1.0 ("<token> <leased_at>"), 4.1.0 to 5.0.0
#: (the numbers between) wrote them, and garbled around the library
LEASES = ["tok", "tok 123", f"tok {NOW} {NOW} 0 0 0 1 123", f"tok {NOW} {NOW} 1 2 3 9 123",
          "tok\t1", "tokX 1", "to 1", "tok ", " tok 1", "tok  1", "tok 1 2", "", "tok 1e3",
          f"tok {NOW} - 0 0 0 1 5", "tok x y z w v u t", f"tok {NOW} {NOW} 0 0 0 1",
          f"tok {NOW} {NOW} 0 0 0 1 2 3"]  # fmt: skip
#: tokens acked: the held one, a prefix of it, longer, with a space, empty
TOKENS = ["tok", "to", "tok ", "", "tokX", "tok 1", " tok"]
#: (a count past MAX_MS is left out: 5.0.0 reads it as 0 from the record, as it is from a
#: lease of its own form: 5.1.0 gives what 5.0.0 gave for the same calls, the latter)
RECS = [f"{NOW} {NOW} 0 0 0 0\t\t1", f"{NOW} {NOW} 2 1 0 3\t\t2", f"{NOW} - 0 0 0 0\t\t3",
        "garbage"]  # fmt: skip


def ack_on(r: redis.Redis, lib: str, n: int, lease: str, token: str, rec: str, kind: str) -> Any:
    B = QueueKeys(f"ls{n}-{lib}", "q", "q").base.encode()
    r.set(B + b":layout", "5")
    r.hset(B + b":rec", "j", rec)
    r.zadd(B + b":expiry", {"c1": NOW + 60_000})
    r.hset(B + b":lease:c1", "j", lease)
    now = NOW + 500
    if kind == "retry":
        reply = r.fcall(lib + "retry", 1, B, now, "c1", 1000, "j", token, now + 10, "retry", 42,
                        NOW + 200, "E", "m", "tb")  # fmt: skip
    elif kind == "fail":
        reply = r.fcall(lib + "fail", 1, B, now, "c1", 1000, 100, 3_600_000, "h", 0, "j", token,
                        "", "", 42, NOW + 200, "E", "k", "m", "tb")  # fmt: skip
    else:
        reply = r.fcall(lib + "finish", 1, B, now, "c1", 1000, 100, 3_600_000, "h", 0, "j", token,
                        42, NOW + 200, "")  # fmt: skip
    return reply, stored(r, B)


@pytest.mark.parametrize("kind", ["finish", "fail", "retry"])
def test_every_lease_form_and_token_acks_as_on_5_0_0(r: redis.Redis, kind: str) -> None:
    """A lease written around the library (HSET) in each form, acked with its token, a prefix
    of it, a longer one: stale or acked, and what is written, as 5.0.0 does."""
    n = 0
    for lease in LEASES:
        for token in TOKENS:
            for rec in RECS:
                n += 1
                old = ack_on(r, "q50_", n, lease, token, rec, kind)
                assert ack_on(r, "queasy_", n, lease, token, rec, kind) == old, (lease, token, rec)
