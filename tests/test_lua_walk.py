"""A seeded random walk over the Lua library: every function, with random and hostile arguments
(bad times, non-JSON data, ids with newlines, unknown kinds and tokens, stale and swept
clients, clocks jumping past expiries), and after EACH step a check that every key agrees.

QUEASY_WALK_STEPS (default 2500) sets the length, QUEASY_WALK_SEED replays a run; the seed is
printed in the failure message. A nightly-sized run: QUEASY_WALK_STEPS=200000.
"""

from __future__ import annotations

import os
import random
import re
from typing import Any

import pytest
import redis
from lua_calls import EVENT_FIELDS, NOW, Lua
from records import living

from queasy_py.store import events
from queasy_py.store.library import ensure_loaded

STEPS = int(os.environ.get("QUEASY_WALK_STEPS", "2500"))
MAX_MS = 253_402_300_799_999
INT = re.compile(r"\d+")
IDS = ["a", "b", "c", "d", "e", "schedule"]  # 'schedule': a schedule's occurrence
HOSTILE_IDS = ["", "x\ny", "x y", "é" * 257, "tab\t", "nul\x00"]
CLIENTS = ["c1", "c2", "c3"]
DATA = ['"x"', '{"k": [1, 2.5, null]}', "0", '"line\\nbreak"']
BAD_DATA = ["", "{", "nan", "0x10", "[1,]", "{'a': 1}"]
BAD_TIMES = ["1e17", "-1", "1.5", str(MAX_MS + 1), "soon", " 7"]
MODES = ["replace", "keep", "if_later", "if_earlier"]
KINDS = ["retry", "timeout", "stall", "release", "return", "sometimes"]
RUN_ATS, BAD_RUN_ATS = ["+0", "+3000"], [*BAD_TIMES, "+", "+-1", "+1.5"]
RESULTS, BAD_RESULTS = ["", '{"r": [1, null]}', "null", '"ok"'], ["{", "nan", "[1,]"]
TEXTS, BAD_TEXTS = ["", "boom", "Traceback (most recent call last):\n  x\nE: é"], ["x" * 65537]
END_STATES = ("finished", "failed", "cancelled")
LISTED = ["waiting", "delayed", "blocked", "active", *END_STATES]
MAX_KEEP = 2  # the largest keep count of the walk (5 ids): no end state holds more records
SPECS = ["every 1s", "cron */2 * * * * * UTC"]
TRACES = ["", "", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]
BAD_TRACES = ["00-XY", "a b", "0" * 257, "t\n"]
TRACE = re.compile(r"[0-9a-f-]{1,256}")
BAD_SPECS = ["", "every\n1s", "x" * 201]


class Walk:
    def __init__(self, r: redis.Redis, prefix: str, seed: int) -> None:
        self.r = r
        self.prefix = prefix
        self.rng = random.Random(seed)
        self.lua = Lua(r, prefix)
        self.now = NOW
        self.nonce = 0
        self.log: list[str] = []
        self.clients = list(CLIENTS)  # a swept client starts over under a new id
        self.listener: Any = None  # the push channels of c1 and c2 (c3 never listens)

    def listen(self, listener: Any) -> None:
        self.listener = listener
        listener.ssubscribe(*(f"{self.lua.B}:push:{c}" for c in self.clients[:2]))

    def renew(self, name: str, args: list, reply: Any) -> None:
        """A client told it was swept starts over under a new id, as a supervisor does (a
        swept id stays dead for 24 h: without this the walk soon has no live client)."""
        swept = (name == "queasy_dequeue" and reply[0] == 2) or (
            name == "queasy_bump" and reply == 2
        )
        if swept and args[1] in self.clients:
            index = self.clients.index(args[1])
            self.clients[index] = f"{CLIENTS[index]}.{self.nonce}.{len(self.log)}"
            self.log.append(self.clients[index])
            if self.listener is not None and index < 2:
                self.listener.ssubscribe(f"{self.lua.B}:push:{self.clients[index]}")

    # ------------------------------------------------------------ random arguments

    def pick(self, good: list, bad: list, p_bad: float = 0.05) -> Any:
        return self.rng.choice(bad) if self.rng.random() < p_bad else self.rng.choice(good)

    def time(self) -> Any:
        roll = self.rng.random()
        if roll < 0.04:
            return self.rng.choice(BAD_TIMES)
        if roll < 0.3:
            return ""
        if roll < 0.33:
            return self.rng.choice([0, MAX_MS])
        return self.now + self.rng.randint(-3_000, 8_000)

    def now_arg(self) -> Any:
        roll = self.rng.random()
        if roll < 0.02:
            return self.rng.choice(BAD_TIMES)
        if roll < 0.035:
            self.now += self.rng.choice([6_000, 11_000, 25_000])  # past half or all an expiry
        else:
            self.now += self.rng.randint(0, 700)
        return self.now

    def keep(self) -> list[Any]:
        """The retention ARGV (count, ms) of finish, fail and cancel."""
        count = self.pick([0, 1, MAX_KEEP, MAX_KEEP], ["-1", "2.5"], 0.03)
        return [count, self.pick([0, 5_000, 3_600_000, 3_600_000], ["1.5"], 0.03)]

    def lease(self, state: dict, holder: str | None = None) -> tuple[str, str, str]:
        """(client, id, token) of a lease held now (by `holder`, if it holds one), else a
        made-up one; sometimes spoiled."""
        held = [(c, i, t) for c, leases in state["leases"].items() for i, t in leases.items()]
        held = [h for h in held if h[0] == holder] or held
        if held and self.rng.random() < 0.85:
            client, id, token = self.rng.choice(held)
        else:
            client, id, token = self.rng.choice(self.clients), self.rng.choice(IDS), "n0.1"
        if self.rng.random() < 0.1:
            token += "x"
        if self.rng.random() < 0.05:
            client = self.rng.choice(self.clients)
        return client, id, token

    # ------------------------------------------------------------ one step

    def step(self, state: dict) -> tuple[str, list, list]:
        """A random call: (function, keys, args)."""
        lua, rng = self.lua, self.rng
        B, F = lua.B, lua.F
        op = rng.choice(
            ["dispatch"] * 5
            + ["dispatch_once"] * 2
            + ["dequeue"] * 4
            + ["finish", "finish", "retry", "retry", "fail", "fail"] * 2
            + ["cancel", "bump", "leave", "unpark", "get_job", "counts", "leases"]
            + ["jobs", "requeue", "purge", "schedule", "schedule", "schedule_info"]
        )
        now = self.now_arg()
        client = self.pick(self.clients, ["c\n1", ""])
        if op == "dispatch":
            args = [now, self.pick(["0", "1"], ["2"]), self.pick(MODES, ["later"])]
            args.append(self.pick(["0", "1"], ["yes"]))
            args.append(self.pick(TRACES, BAD_TRACES))
            for _ in range(rng.randint(1, 4)):
                args += [self.pick(IDS, HOSTILE_IDS), self.pick(DATA, BAD_DATA), self.time()]
            if rng.random() < 0.02:
                args.append("partial")
            return "queasy_dispatch", [B], args
        if op == "dispatch_once":
            args = [now, self.pick(["0", "1"], ["2"]), self.pick(MODES, ["later"])]
            args.append(self.pick(["0", "1"], ["yes"]))
            args.append(self.pick(["1", "2000", "60000"], ["0", "-5", "1.5", ""]))
            for _ in range(rng.randint(1, 4)):
                args += [self.pick(IDS, HOSTILE_IDS), self.pick(DATA, BAD_DATA), self.time()]
            return "queasy_dispatch_once", [B], args
        if op == "dequeue":
            self.nonce += 1
            limit = self.pick([0, 1, 2, 4, 4], ["-1", "2.5"])
            park = rng.choice(["0", "1", "1"])
            return "queasy_dequeue", [B], [now, client, f"n{self.nonce}", limit, 10_000, 50, park]
        if op in ("finish", "retry", "fail"):
            groups: list = []
            holder = None
            for _ in range(rng.randint(1, 3)):
                holder, id, token = self.lease(state, holder)
                pid, started = self.pick(["42", ""], ["4.2"]), self.pick([self.now, ""], ["1e12"])
                text = self.pick(TEXTS, BAD_TEXTS, 0.02)
                if op == "finish":
                    groups += [id, token, pid, started, self.pick(RESULTS, BAD_RESULTS)]
                elif op == "retry":
                    kind = rng.choice(KINDS)
                    run_at = self.pick([self.now, self.now + 3_000, *RUN_ATS], BAD_RUN_ATS)
                    groups += [id, token, run_at, kind, pid, started, "ValueError", text, text]
                else:
                    fid = self.pick([f"f{rng.randint(1, 9)}"], ["f\n1"])
                    groups += [id, token, fid, '["x"]', pid, started, "KeyError", "permanent"]
                    groups += [text, text]
            keys = [B, F] if op != "fail" or rng.random() < 0.8 else [B]
            if op == "fail" and len(keys) == 1:
                groups = [g if n % 10 not in (2, 3) else "" for n, g in enumerate(groups)]
            head = [now, holder, 50]
            if op != "retry":
                head += [*self.keep(), self.pick(["h1", ""], BAD_TEXTS, 0.02)]
                head.append(self.pick(["0", "1"], ["yes"]))
            return f"queasy_{op}", keys, [*head, *groups]
        if op == "cancel":
            return "queasy_cancel", [B], [now, 50, self.pick(IDS, HOSTILE_IDS), *self.keep()]
        if op == "jobs":
            cursor = self.pick(["0", "0", "2", "1.0"], ["-1", "x", "1.x"])
            limit = self.pick([1, 3, 1000], [0, 1001])
            state = self.pick(LISTED, ["running"])
            return "queasy_jobs", [B], [now, state, cursor, limit, self.pick(["0", "1"], ["2"])]
        if op == "requeue":
            ids = rng.sample(IDS, rng.randint(0, 2))
            if rng.random() < 0.2:
                ids.append(self.pick(IDS, HOSTILE_IDS))
            cutoff = self.pick([self.now, ""], BAD_TIMES)
            return "queasy_requeue", [B], [now, cutoff, self.pick([1, 3], [0]), *ids]
        if op == "purge":
            state = self.pick(["waiting", "delayed", "blocked", *END_STATES], ["active"], 0.1)
            return "queasy_purge", [B], [now, state, self.pick([1, 2], [0])]
        if op == "bump":
            return "queasy_bump", [B], [now, client, self.pick([10_000], ["0"]), 50]
        if op == "leave":
            return "queasy_leave", [B], [now, client]
        if op == "unpark":
            return "queasy_unpark", [B], [now, client, self.pick(["mark-1"], ["mark\n2"])]
        if op == "schedule":
            return "queasy_schedule", [B], [now, *self.schedule_args(state)]
        if op == "schedule_info":
            return "queasy_schedule_info", [B], [now]
        if op == "get_job":
            return "queasy_get_job", [rng.choice([B, F])], [now, self.pick(IDS, HOSTILE_IDS)]
        if op == "counts":
            return "queasy_counts", [rng.choice([B, F])], [now]
        return "queasy_leases", [B], [now, client]

    def schedule_args(self, state: dict) -> list:
        """spec, seen, create_at, retime_at, skipped if created, skipped if moved: mostly
        from the fire time stored (as a supervisor computes), sometimes stale or hostile."""
        rng = self.rng
        stored = state["raw"].get(self.lua.B + ":schedule", ("hash", {}))[1]
        fire_at = stored.get("fire_at")
        seen: Any = fire_at if fire_at is not None and rng.random() < 0.8 else ""
        if rng.random() < 0.1:
            seen = self.pick([self.now + rng.randint(-5_000, 5_000)], BAD_TIMES, 0.3)
        base = int(seen) if INT.fullmatch(str(seen)) else self.now
        create_at: Any = base + rng.randint(1, 4_000)
        if rng.random() < 0.1:
            create_at = self.pick([base], BAD_TIMES, 0.5)  # not later than seen, or bad
        retime_at: Any = ""
        if rng.random() < 0.4:
            last = int(stored.get("last_fire_at") or 0)
            retime_at = self.pick([max(self.now, last) + rng.randint(-1_000, 6_000)], BAD_TIMES)
        spec = self.pick(SPECS, BAD_SPECS)
        skipped = [self.pick([0, rng.randint(1, 9)], ["-1", "x"]) for _ in range(2)]
        return [spec, seen, create_at, retime_at, *skipped]

    # ------------------------------------------------------------ every key, read back

    def read(self) -> dict:
        r = self.r
        raw: dict[str, Any] = {}
        keys = sorted(r.scan_iter(match=f"{self.prefix}:*", count=1000))
        with r.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.type(key)
            kinds = pipe.execute()
        # a B:once:<id> or B:window bucket may expire (PX, the server's clock) between SCAN
        # and TYPE
        keys, kinds = (
            [k for k, t in zip(keys, kinds, strict=True) if t != "none"],
            [t for t in kinds if t != "none"],
        )
        readers = {
            "hash": lambda p, k: p.hgetall(k),
            "zset": lambda p, k: p.zrange(k, 0, -1, withscores=True),
            "set": lambda p, k: p.smembers(k),
            "stream": lambda p, k: p.xrange(k),
            "string": lambda p, k: p.get(k),
        }
        with r.pipeline(transaction=False) as pipe:
            for key, kind in zip(keys, kinds, strict=True):
                readers[kind](pipe, key)
            values = pipe.execute()
        for key, kind, value in zip(keys, kinds, values, strict=True):
            if (kind == "string" and value is None) or (kind == "hash" and not value):
                continue  # a B:once:<id> or B:window key that expired between TYPE and GET
            raw[key] = (kind, value)
        B = self.lua.B
        state = {"raw": raw, "leases": {}}
        for key, (_, value) in raw.items():
            if key.startswith(B + ":lease:"):
                state["leases"][key[len(B) + 7 :]] = value
        return state

    def check(self, state: dict) -> None:
        raw = state["raw"]
        for base in (self.lua.B, self.lua.F):
            check_queue(base, raw)
        for row, base in ((self.lua.counts(now=self.now), self.lua.B),):
            waiting = dict(raw.get(base + ":waiting", ("zset", []))[1])
            view = living(raw, base)
            assert row["waiting"] + row["delayed"] == len(waiting)
            assert row["blocked"] == len(view.blocked)
            assert row["active"] == len(view.actives)


def is_int(text: Any, empty_ok: bool = False) -> bool:
    return (empty_ok and text == "") or (isinstance(text, str) and bool(INT.fullmatch(text)))


def check_queue(B: str, raw: dict) -> None:
    """The invariants of one queue's keys (lua/queasy.lua, key layout)."""

    def get(suffix: str, empty: Any) -> Any:
        return raw.get(B + suffix, (None, empty))[1]

    waiting = dict(get(":waiting", []))
    view = living(raw, B)  # 4.x's B:job:<id> and B:active:<id>, B:blocked's ids (or 5.0's)
    blocked, records, actives = view.blocked, view.records, view.actives
    expiry, fresh = dict(get(":expiry", [])), dict(get(":fresh", []))
    leases = {k[len(B) + 7 :]: v for k, (_, v) in raw.items() if k.startswith(B + ":lease:")}
    for zset in (waiting, expiry, fresh, dict(get(":swept", []))):
        for member, score in zset.items():
            assert score == int(score) and 0 <= score, (member, score)
    assert set(expiry) == set(fresh), "every live client has an expiry and a freshness"
    assert not set(waiting) & blocked, "no id both waiting and blocked"
    for id in waiting:
        assert id in records and id not in actives, f"waiting {id!r} has its record only"
        assert waiting[id] == int(records[id]["run_at"]), f"score of {id!r} is its run_at"
    for id in blocked:
        assert id in records and id in actives, f"blocked {id!r} waits for an active one"
    for id, record in records.items():
        assert id in waiting or id in blocked, f"orphan record {id!r}"
        assert record["id"] == id
        for field in ("run_at", *LIFE):
            assert is_int(record[field]), (id, field, record[field])
        check_counts(id, record)
        check_error(id, record)
        check_trace(id, record)
        assert int(record["run_at"]) <= MAX_MS
        if id in blocked:
            assert record["u_run_at"] in ("replace", "clamp"), record
            assert is_int(record["u_lo"], True) and is_int(record["u_hi"], True), record
        else:
            assert "u_run_at" not in record, record
    # library 4.0.0: an active record is the waiting one renamed as it is (attempts: the
    # leases before this one); its lease is in B:lease:<client> only (4.1.0 to 5.0.0: with
    # the record's numbers too; 5.1.0: "<token> <leased_at>" again, lease_line)
    holders = {id: client for client, held in leases.items() for id in held}
    for id, record in actives.items():
        for field in ("run_at", *LIFE):
            assert is_int(record[field]), (id, field, record[field])
        check_counts(id, record)
        assert not {"client", "token", "leased_at"} & set(record), f"lease fields in {id!r}"
        assert id in holders, f"an active {id!r} is held by a client"
        assert sum(id in held for held in leases.values()) == 1, f"{id!r} held once"
        check_error(id, record)
        check_trace(id, record)
    check_ended(B, raw)
    for client, held in leases.items():
        assert client in expiry, f"lease holder {client!r} has an expiry"
        for id, value in held.items():
            assert id in actives, f"{client!r} holds {id!r}: it is active"
            check_lease(id, value, actives[id])
    for key, (_, value) in raw.items():
        if key.startswith(B + ":once:"):
            # (None: it expired between the TYPE and the GET of `read`)
            assert value is None or is_int(value), f"the window end of {key!r}: {value!r}"
        if key.startswith(B + ":window:"):  # library 4.1.0: a bucket of windows, id -> end
            size, k = key[len(B) + 8 :].split(":")
            assert is_int(size) and is_int(k), f"a bucket's name: {key!r}"
            for id, end in value.items():
                assert is_int(end) and int(end) // int(size) == int(k), (key, id, end)
    for bucket, ends in get(":windows", []):
        size, k = bucket.split(":")
        assert ends == (int(k) + 1) * int(size), f"B:windows {bucket!r}: {ends}"
    for client, slots in get(":parked", {}).items():
        assert client in expiry and is_int(slots) and int(slots) > 0, (client, slots)
    sched = get(":schedule", {})
    for field in ("fire_at", "last_fire_at", "last_ended_at", "skipped"):
        assert is_int(sched.get(field, ""), True), (field, sched)
    if sched.get("fire_at") and sched.get("last_fire_at"):
        assert int(sched["last_fire_at"]) <= int(sched["fire_at"]), sched
    for _, entry in get(":events", []):
        # library 4.0.0: one line, and the error fields only with an error
        assert set(entry) in ({"event"}, {"event", *events.ERROR_FIELDS}), entry
        assert len(entry["event"].split(" ")) == len(events.LINE_FIELDS), entry
        event = events.fields_of(entry, B.rsplit(":", 1)[1])
        assert set(event) == EVENT_FIELDS, event
        for field in ("run_at", "ended_at", "retry_count", "stall_count", "timeout_count"):
            assert is_int(event[field]), (field, event)
        for field in ("started_at", "pid", "enqueued_at"):
            assert is_int(event[field], True), (field, event)
        assert len(event["traceback"].encode()) <= 1024, event
    for field, value in get(":stats", {}).items():
        assert re.fullmatch(r"(finished|failed)(:\d+)?", field) and is_int(value), (field, value)


#: fields every waiting, active and ended record has (dispatch writes them)
LIFE = ("enqueued_at",)
#: fields a record holds once they are not 0 (library 4.0.0: absent reads as 0)
COUNTED = ("retry_count", "stall_count", "timeout_count", "attempts")


def check_counts(id: str, record: dict) -> None:
    for field in COUNTED:
        assert is_int(record.get(field, "0")), (id, field, record[field])


def check_lease(id: str, value: str, record: dict) -> None:
    """A lease (library 5.1.0): "<token> <leased_at>" (4.1.0 to 5.0.0 wrote the numbers of
    its active record between them; an ack reads them from the record now)."""
    words = value.split(" ")
    assert len(words) == 2 and words[0] and is_int(words[1]), (id, value, record)


def check_error(id: str, record: dict) -> None:
    """A record's last error: all of its fields, or none."""
    fields = ("error_name", "error_kind", "error_message", "traceback", "error_at")
    present = [f for f in fields if f in record]
    assert present in ([], list(fields)), (id, record)
    if present:
        assert is_int(record["error_at"]), (id, record)


def check_trace(id: str, record: dict) -> None:
    """A record's trace context, when it has one: a traceparent's characters, bounded."""
    if "trace" in record:
        assert TRACE.fullmatch(record["trace"]), (id, record)


#: the fields of an end in B:ends, in order (the host last: it may hold spaces)
END_FIELDS = ("state", "ended_at", "started_at", "pid", "attempts", "run_at", "enqueued_at")
END_FIELDS += ("retry_count", "stall_count", "timeout_count", "client", "host")


def check_ended(B: str, raw: dict) -> None:
    """Each end kept (B:ends) is in the index of its state with its end time as score; an
    ended record kept whole has its end (a failed or cancelled one always is whole; a
    finished one when it has a result or an earlier error); the retention holds every index
    to MAX_KEEP (an id that ended again in another state may stay in an index: readers go by
    its end, and the trim drops the entry like the others)."""
    ended = {k[len(B) + 7 :]: v for k, (_, v) in raw.items() if k.startswith(B + ":ended:")}
    ends = raw.get(B + ":ends", (None, {}))[1]
    assert set(ended) <= set(ends), "every record kept whole has its end"
    index = {state: dict(raw.get(f"{B}:{state}", (None, []))[1]) for state in END_STATES}
    for state, entries in index.items():
        assert len(entries) <= MAX_KEEP, f"{len(entries)} {state} entries kept"
    for id, line in ends.items():
        end = dict(zip(END_FIELDS, line.split(" ", len(END_FIELDS) - 1), strict=True))
        state = end["state"]
        assert state in END_STATES, (id, line)
        assert index[state].get(id) == int(end["ended_at"]), f"{state} {id!r} is indexed"
        for field in END_FIELDS[1:10]:
            assert is_int(end[field]) or end[field] == "-", (id, field, line)
        if state == "cancelled":
            assert (end["started_at"], end["pid"]) == ("-", "-"), (id, line)
        if state != "finished":
            assert id in ended, f"a {state} record is kept whole: {id!r}"
        record = ended.get(id)
        if record is None:
            continue
        assert record["id"] == id
        for field in ("run_at", *LIFE):
            assert is_int(record[field]), (id, field, record[field])
        check_counts(id, record)
        check_error(id, record)
        assert "result" not in record or state == "finished", record
        if state == "finished":
            assert "result" in record or "error_name" in record, f"finished {id!r} kept whole"


def schedule_grew(B: str, before: dict, after: dict) -> str | None:
    """What went wrong with B:schedule across one step, if anything: its skipped count never
    goes back; its fire time goes back only when a pending occurrence that never ran is moved
    earlier (a schedule changed), and then stays later than the last fire time that ended (so
    a fire time is never created twice); the fire time of the last occurrence that ended is
    the fire time it had."""
    old = before.get(B + ":schedule", ("hash", {}))[1]
    new = after.get(B + ":schedule", ("hash", {}))[1]
    if old.get("skipped") and int(new.get("skipped", -1)) < int(old["skipped"]):
        return f"B:schedule skipped went back: {old} -> {new}"
    if old.get("fire_at") and int(new.get("fire_at", -1)) < int(old["fire_at"]):
        last = new.get("last_fire_at")
        if new.get("last_fire_at") != old.get("last_fire_at") or (
            last and int(new["fire_at"]) <= int(last)
        ):
            return f"B:schedule fire_at went back: {old} -> {new}"
    if new.get("last_fire_at") != old.get("last_fire_at") and new["last_fire_at"] not in (
        "",
        old.get("fire_at"),
    ):
        return f"B:schedule last_fire_at is not the fire time it had: {old} -> {new}"
    return None


def unexpired(raw: dict, later: dict | None = None) -> dict:
    """`raw` without the B:once:<id> keys and B:window buckets missing from `later`: they
    expire on the server's clock (PX), which a walk does not control."""
    if later is None:
        return raw
    return {
        k: v for k, v in raw.items() if (":once:" not in k and ":window:" not in k) or k in later
    }


@pytest.fixture
def walk(r: redis.Redis, redis_url: str, prefix: str) -> Walk:
    with redis.Redis.from_url(redis_url) as conn:
        ensure_loaded(conn)
    seed = int(os.environ.get("QUEASY_WALK_SEED") or random.randrange(2**32))
    return Walk(r, prefix, seed), seed  # type: ignore[return-value]


def test_random_walk_keeps_every_key_consistent(walk, r: redis.Redis) -> None:
    walk, seed = walk
    listener = r.pubsub()
    walk.listen(listener)
    try:
        state = walk.read()
        for n in range(STEPS):
            name, keys, args = walk.step(state)
            try:
                reply = walk.lua.call(name, keys, *args)
                error = None
                walk.renew(name, args, reply)
            except redis.ResponseError as exc:
                error = str(exc)
            after = walk.read()
            context = f"seed {seed} (QUEASY_WALK_SEED={seed}), step {n}: {name} {keys} {args!r}"
            grown = schedule_grew(walk.lua.B, state["raw"], after["raw"])
            assert grown is None, f"{context}: {grown}"
            if name == "queasy_dispatch_once" and error is None:
                assert set(reply) <= {1, 2, 5}, f"{context}: never a blocked copy: {reply}"
            if error is not None:
                assert error.startswith("INVALID "), f"{context}: {error}"
                assert unexpired(after["raw"]) == unexpired(state["raw"], after["raw"]), (
                    f"{context}: refused, yet wrote"
                )
            try:
                walk.check(after)
            except AssertionError as exc:
                raise AssertionError(f"{context}: {exc}") from None
            state = after
            if n % 200 == 0:
                listener.get_message(timeout=0)  # drain the push messages now and then
                while listener.get_message(timeout=0) is not None:
                    pass
    finally:
        listener.close()
