"""Library 5.0 against 4.4.0 on a random walk: the same calls (dispatch, dispatch_once,
dispatch_letter, dequeue, parked dequeue with its pushes, unpark, leave, finish, retry, fail,
cancel, queasy_requeue, queasy_purge, bump with its sweep, and the readers) on both, from an
empty queue; after every call the replies and the stored states must be equal (4.4.0's
state seen in 5.0's layout: tests/layout5_twin.py). QUEASY_TWIN_SEED replays one walk."""

from __future__ import annotations

import os
import random
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
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
IDS = ["a", "b", "c", "d", "e"]
CLIENTS = ["c1", "c2"]
SEEDS = [int(os.environ["QUEASY_TWIN_SEED"])] if "QUEASY_TWIN_SEED" in os.environ else [1, 2, 3]


@pytest.fixture(scope="module")
def conn(own_server: Any) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(own_server.url, decode_responses=True)
    load_both(r, source())
    try:
        yield r
    finally:
        r.close()


STATES = ("waiting", "delayed", "blocked", "active", "finished", "failed", "cancelled")


def unordered(reply: Any) -> Any:
    """A reader's reply with its fields and rows in no order: a job's fields come in the
    order of 4.4.0's record hash (an update's HSET appends), and queasy_jobs lists the
    blocked ones in the order of 4.4.0's set."""
    if isinstance(reply, list) and reply and reply[0] == "0":  # queasy_jobs: cursor, rows
        return ["0", sorted((unordered(row) for row in reply[1:]), key=repr)]
    if isinstance(reply, list) and len(reply) == 2 and isinstance(reply[1], list):
        return (reply[0], sorted(zip(reply[1][0::2], reply[1][1::2], strict=True)))
    return reply


class Walk:
    def __init__(self, twin: Twin, seed: int) -> None:
        self.t, self.rng, self.now, self.n = twin, random.Random(seed), NOW, 0
        self.held: dict[str, dict[str, str]] = {c: {} for c in CLIENTS}  # client -> id -> token

    def keep(self) -> list[int]:
        return self.rng.choice([[100, 3_600_000], [2, 3_600_000], [0, 0], [100, 5_000]])

    def lease(self, client: str) -> tuple[str, str]:
        """One of the client's leases, now and then a stale token or another id."""
        rng, held = self.rng, self.held[client]
        if not held or rng.random() < 0.1:
            return rng.choice(IDS), f"x{rng.randrange(9)}.1"
        return rng.choice(sorted(held.items()))

    def step(self) -> None:
        rng, t = self.rng, self.t
        self.now += rng.choice([0, 1, 50, 700, 3000])
        self.n += 1
        now, client = self.now, rng.choice(CLIENTS)
        op = rng.choice(
            ["dispatch"] * 4 + ["dequeue"] * 3 + ["finish"] * 3 + ["retry"] * 2
            + ["fail", "cancel", "requeue", "purge", "bump"]
            + ["once", "park", "unpark", "leave", "letter", "read"]
        )  # fmt: skip
        if op in ("once", "park", "unpark", "leave", "letter", "read"):
            self.more(op, now, client)
        elif op == "dispatch":
            flags = [rng.choice([0, 1]), rng.choice(["replace", "keep", "if_later", "if_earlier"])]
            flags += [rng.choice([0, 1]), rng.choice(["", TRACE])]
            triples = []
            for _ in range(rng.randint(1, 3)):
                run_at = rng.choice(["", now + rng.choice([-5, 0, 400, 5000])])
                triples += [rng.choice(IDS), f'"{self.n}"', run_at]
            t.both("dispatch", now, *flags, *triples)
        elif op == "dequeue":
            reply = t.both(
                "dequeue", now, client, f"n{self.n}", rng.randint(1, 3), EXPIRY, MAXLEN, 0
            )
            if reply[0] == 0:
                for k in range(2, len(reply), 8):
                    self.held[client][reply[k]] = reply[k + 1]
            else:
                self.held[client].clear()
        elif op in ("finish", "retry", "fail"):
            acks = [self.lease(client) for _ in range(rng.randint(1, 2))]
            args: list[Any] = []
            for id, token in acks:
                if op == "finish":
                    args += [id, token, "42", now - 1, rng.choice(["", "[1]"])]
                elif op == "retry":
                    kind = rng.choice(["retry", "timeout", "stall", "release", "return"])
                    at = rng.choice([now, now + 300, "+2000"])
                    args += [id, token, at, kind, "7", now - 1, "E", f"m{self.n}", "tb"]
                else:
                    args += [
                        id,
                        token,
                        f"f{self.n}-{id}",
                        '["x"]',
                        "8",
                        now - 1,
                        "K",
                        "k",
                        "m",
                        "t",
                    ]
            if op == "finish":
                codes = t.both("finish", now, client, MAXLEN, *self.keep(), "h", 0, *args)
            elif op == "retry":
                codes = t.both("retry", now, client, MAXLEN, *args)
            else:
                codes = t.both(
                    "fail", now, client, MAXLEN, *self.keep(), "h", 0, *args, fail_queue=True
                )
            for (id, token), code in zip(acks, codes, strict=True):
                if code == 0 and self.held[client].get(id) == token:
                    del self.held[client][id]
        elif op == "cancel":
            t.both("cancel", now, MAXLEN, rng.choice(IDS), *self.keep())
        elif op == "requeue":
            t.both("requeue", now, "", rng.randint(1, 3), *rng.sample(IDS, rng.randint(0, 2)))
        elif op == "purge":
            state = rng.choice(["waiting", "delayed", "blocked", "finished", "failed", "cancelled"])
            # (blocked ones are taken at random, by each library its own way: all of them)
            limit = len(IDS) if state == "blocked" else rng.randint(1, 2)
            t.both("purge", now, state, limit, 1)
        else:  # a heartbeat, now and then past the other's expiry: the sweep
            self.now += rng.choice([0, 0, EXPIRY + 1])
            if t.both("bump", self.now, client, EXPIRY, MAXLEN) == 2:
                self.held[client].clear()
        t.check()

    def more(self, op: str, now: int, client: str) -> None:
        """The calls beyond the end of an attempt: dispatch_once (windows long enough not to
        expire while the walk runs: the states compare their keys), a parked dequeue and
        the pushes it takes, unpark, leave, dispatch_letter, and the readers."""
        rng, t = self.rng, self.t
        if op == "once":
            flags = [rng.choice([0, 1]), rng.choice(["replace", "keep", "if_later", "if_earlier"])]
            flags += [rng.choice([0, 1]), rng.choice([100_000, 300_000])]
            triples = []
            for _ in range(rng.randint(1, 3)):
                run_at = rng.choice(["", now + rng.choice([-5, 0, 400, 5000])])
                triples += [rng.choice(IDS), f'"{self.n}"', run_at]
            t.both("dispatch_once", now, *flags, *triples)
        elif op == "park":
            args = [now, client, f"n{self.n}", rng.randint(0, 3), EXPIRY, MAXLEN, 1]
            reply = t.both("dequeue", *args)
            if reply[0] == 0:
                for k in range(2, len(reply), 8):
                    self.held[client][reply[k]] = reply[k + 1]
            else:
                self.held[client].clear()
        elif op == "unpark":
            t.both("unpark", now, client, f"m{self.n}")
        elif op == "leave":
            t.both("leave", now, client)
        elif op == "letter":
            at = rng.choice(["", NOW])
            t.both("dispatch_letter", now, rng.choice(["", TRACE]), rng.choice(IDS), '"l"', at)
        else:
            self.read(now)

    def read(self, now: int) -> None:
        """Every reader answers the same on both (fields and rows in no order: unordered)."""
        t = self.t

        def same(name: str, *args: Any) -> None:
            old = t.r.fcall("q44_" + name, 1, t.B4, *args)
            new = t.r.fcall("queasy_" + name, 1, t.B5, *args)
            assert unordered(old) == unordered(new), (name, args, old, new)

        for id in IDS:
            same("get_job", now, id)
        same("counts", now)
        for client in CLIENTS:
            old = sorted(t.r.fcall("q44_leases", 1, t.B4, now, client))
            assert old == sorted(t.r.fcall("queasy_leases", 1, t.B5, now, client))
        for state in STATES:
            same("jobs", now, state, "0", 100, self.rng.choice(["0", "1"]))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_walk_replies_and_stores_as_4_4_0(conn: redis.Redis, seed: int) -> None:
    twin = Twin(conn, f"w{uuid.uuid4().hex[:8]}")
    twin.to_layout5()  # (an empty queue, marked)
    walk = Walk(twin, seed)
    for n in range(300):
        try:
            walk.step()
        except AssertionError as e:
            calls = "\n".join(f"  {name} {args}" for name, args in twin.log[-8:])
            raise AssertionError(
                f"seed {seed} (QUEASY_TWIN_SEED), step {n}: {e}\n{calls}"
            ) from None
