"""Library 5.0 side by side with 4.4.0 (tests/fixtures/queasy-4.4.0.lua), for the tests of the
end of an attempt (finish, retry, fail, cancel, sweep, requeue, purge) on 5.0's one-hash layout.

4.4.0 is loaded beside 5.0 under other names (library `queasy44`, functions `q44_*`), so one
server runs both. A queue's 4.x state made by 4.4.0's own calls (prefix p4) is copied into
5.0's layout (prefix p5: `as_layout5`, what the upgrade of the spec makes of it); then each
call runs on both, and the replies and the stored states (the 4.x one seen through
`as_layout5`) must be equal. Leases compare as (token, leased_at) only (`lease_key`): since
5.1.0 a lease holds no numbers of its record, which 4.x's held between them. A dequeue is
run on the 5.x side both ways: as called (8 values per job, as 4.4.0's) and, on a copy of
its queue, with the reply 'rec' (id, token, record per job: `rec_reply_checked`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis

from queasy_py.store.keys import QueueKeys

FIXTURE = Path(__file__).parent / "fixtures" / "queasy-4.4.0.lua"

COUNTS = ("retry_count", "stall_count", "timeout_count", "attempts")
ERRORS = (
    ("error_name", "name"),
    ("error_kind", "kind"),
    ("error_message", "message"),
    ("traceback", "traceback"),
    ("error_at", "at"),
)


def load_both(r: redis.Redis, source: str) -> None:
    """Load `source` (5.0) and 4.4.0 renamed (library queasy44, functions q44_*)."""
    old = FIXTURE.read_text()
    old = old.replace("#!lua name=queasy\n", "#!lua name=queasy44\n", 1)
    old = old.replace("register_function('queasy_", "register_function('q44_")
    old = old.replace("function_name = 'queasy_", "function_name = 'q44_")
    r.function_load(source, replace=True)
    r.function_load(old, replace=True)


def rec_string(h: dict[str, str]) -> str:
    """4.x's record hash as 5.0's record string (layout5.md, records (5.0 layout))."""
    nums = [h.get("run_at", "0"), h.get("enqueued_at") or "-"]
    nums += [h.get(name) or "0" for name in COUNTS]
    return " ".join(nums) + "\t" + h.get("trace", "") + "\t" + h.get("data", "")


def error_of(h: dict[str, str]) -> dict[str, str] | None:
    """4.x's last error fields of a record as B:err's JSON object (parsed), or None."""
    if "error_name" not in h:
        return None
    return {name: h[field] for field, name in ERRORS}


def ended_hash(h: dict[str, str], state: str) -> dict[str, str]:
    """4.x's kept record as 5.0 writes it: 5.0 cannot tell the counts 0 that 4.x wrote at
    an update of a job never requeued (a dispatch's update) from those it left absent
    (every reader takes an absent count for 0), so it writes neither: a record whose
    counts are 0 and that was never leased before (its attempts, counting the lease that
    ended it when it `state` is not 'cancelled', say so) has none."""
    counts = ("retry_count", "stall_count", "timeout_count")
    first = ("0",) if state == "cancelled" else ("0", "1")
    if h.get("attempts", "0") not in first or any(h.get(c, "0") != "0" for c in counts):
        return h
    return {k: v for k, v in h.items() if k not in counts}


def lease_key(value: str) -> tuple[str, str]:
    """A lease as (token, leased_at): 5.1.0 writes "<token> <leased_at>", 4.1.0 to 5.0.0 the
    numbers of the record between them (which 5.1.0's ack reads from the record)."""
    words = value.split(" ")
    return words[0], words[-1]


def leases_keyed(kind_value: tuple[str, Any]) -> tuple[str, Any]:
    """A lease hash (read()'s tuple) with its values as lease_key gives them."""
    kind, value = kind_value
    return kind, {id: lease_key(v) for id, v in value.items()}


def state_of(r: redis.Redis, base: str, id: str) -> str:
    """The state of the end of `id` (B:ends), '' when none."""
    return (r.hget(base + ":ends", id) or "").split(" ")[0]


def as_layout5(r: redis.Redis, base: str) -> dict[str, Any]:
    """Every key of queue `base` as 5.0 stores it, keyed by its name after `base`: B:job:<id>
    and B:active:<id> into B:rec (+ B:err), the B:blocked set into the hash; others as they
    are. A 5.0 queue gives the same shape (`state(r, base)`), so both compare."""
    out: dict[str, Any] = {}
    recs: dict[str, str] = {}
    errs: dict[str, dict[str, str]] = {}
    blocked_ids = (
        set(r.smembers(base + ":blocked")) if r.type(base + ":blocked") == "set" else set()
    )
    blocked: dict[str, str] = {}
    for key in r.scan_iter(match=base + ":*", count=1000):
        name = key[len(base) :]
        if name.startswith((":job:", ":active:")):
            id = name.split(":", 2)[2]
            h = r.hgetall(key)
            if name.startswith(":job:") and id in blocked_ids:
                lo, hi = h.get("u_lo") or "-", h.get("u_hi") or "-"
                flags = [h.get("u_data", "0"), h.get("u_reset", "0"), h["u_run_at"], lo, hi]
                blocked[id] = " ".join(flags) + "\t" + rec_string(h)
                continue
            recs[id] = rec_string(h)
            if error_of(h) is not None:
                errs[id] = error_of(h)  # type: ignore[assignment]
        elif name == ":blocked":
            continue
        elif name.startswith(":ended:"):
            ended = state_of(r, base, name[len(":ended:") :])
            out[name] = ("hash", ended_hash(r.hgetall(key), ended))
        else:
            out[name] = read(r, key)
    if recs:
        out[":rec"] = ("hash", recs)
    if errs:
        out[":err"] = ("hash", errs)
    if blocked:
        out[":blocked"] = ("hash", blocked)
    return out


def state(r: redis.Redis, base: str) -> dict[str, Any]:
    """Every key of 5.0 queue `base`, as as_layout5 gives a 4.x one (B:err parsed)."""
    out = {}
    for key in r.scan_iter(match=base + ":*", count=1000):
        name = key[len(base) :]
        if name == ":layout":
            continue
        out[name] = read(r, key)
        if name == ":err":
            out[name] = ("hash", {k: json.loads(v) for k, v in out[name][1].items()})
    return out


def read(r: redis.Redis, key: str) -> tuple[str, Any]:
    kind = r.type(key)
    if kind == "hash":
        return kind, r.hgetall(key)
    if kind == "zset":
        return kind, r.zrange(key, 0, -1, withscores=True)
    if kind == "set":
        return kind, sorted(r.smembers(key))
    if kind == "stream":
        return kind, [fields for _, fields in r.xrange(key)]
    return kind, r.get(key)


def copy_as_layout5(r: redis.Redis, base4: str, base5: str) -> None:
    """Write 4.x queue `base4` into `base5` in 5.0's layout (as_layout5), marked '5'."""
    for name, (kind, value) in as_layout5(r, base4).items():
        key = base5 + name
        if kind == "hash":
            if name == ":err":
                value = {k: json.dumps(v) for k, v in value.items()}
            r.hset(key, mapping=value)
        elif kind == "zset":
            r.zadd(key, dict(value))
        elif kind == "set":
            r.sadd(key, *value)
        elif kind == "stream":
            for fields in value:
                r.xadd(key, fields)
        else:
            r.set(key, value)
    r.set(base5 + ":layout", "5")


class Twin:
    """One queue `q` under two prefixes: p4 run by 4.4.0 (q44_*), p5 by 5.0 (queasy_*)."""

    def __init__(self, r: redis.Redis, prefix: str) -> None:
        self.r = r
        self.B4 = QueueKeys(prefix + "-4", "q", "q").base
        self.B5 = QueueKeys(prefix + "-5", "q", "q").base
        self.B5r = QueueKeys(prefix + "-5r", "q", "q").base  # a copy of B5: a dequeue's 'rec'
        self.F4 = QueueKeys(prefix + "-4", "q-fail", "q").base
        self.F5 = QueueKeys(prefix + "-5", "q-fail", "q").base
        self.copied = False  # before to_layout5, both() runs 4.4.0 only (making the state)
        self.log: list[tuple[str, tuple]] = []  # the calls run on both

    def old(self, name: str, *args: Any, fail_queue: bool = False) -> Any:
        """A call of 4.4.0 on p4 (`name` without its prefix: 'dispatch')."""
        keys = [self.B4, self.F4] if fail_queue else [self.B4]
        return self.r.fcall("q44_" + name, len(keys), *keys, *args)

    def to_layout5(self) -> None:
        """p4's state so far becomes p5's (and its fail queue's)."""
        copy_as_layout5(self.r, self.B4, self.B5)
        copy_as_layout5(self.r, self.F4, self.F5)
        self.copied = True

    def both(self, name: str, *args: Any, fail_queue: bool = False) -> Any:
        """Call `name` on both; the replies must be equal (errors too); returns the reply.
        Before to_layout5, on 4.4.0 only."""
        if not self.copied:
            return self.old(name, *args, fail_queue=fail_queue)
        self.log.append((name, args))
        if name == "dequeue":
            self.copy_5(self.B5, self.B5r)
        replies = []
        for lib, B, F in (("q44_", self.B4, self.F4), ("queasy_", self.B5, self.F5)):
            keys = [B, F] if fail_queue else [B]
            try:
                replies.append(self.r.fcall(lib + name, len(keys), *keys, *args))
            except redis.ResponseError as e:
                replies.append(("error", str(e).split(" script: ")[0]))
        assert replies[0] == replies[1], (name, args, replies)
        if name == "dequeue":
            self.rec_reply_checked(args, replies[1])
        return replies[0]

    def copy_5(self, src: str, dst: str) -> None:
        """Every key of 5.x queue `src` copied under `dst` (those of `dst` dropped first)."""
        for key in self.r.scan_iter(match=dst + ":*", count=1000):
            self.r.unlink(key)
        for key in self.r.scan_iter(match=src + ":*", count=1000):
            self.r.copy(key, dst + key[len(src) :])

    def rec_reply_checked(self, args: tuple, wide: Any) -> None:
        """The dequeue `args` again on B5r (B5 as it was before it) with the reply 'rec': the
        same status, next_run_at, ids and tokens as `wide` (B5's reply), each job's record
        as B5 held it (every record of the walk is the library's: handed out as it is) and
        the same numbers, trace and data as `wide` has; B5r's keys then equal B5's."""
        before = self.r.hgetall(self.B5r + ":rec")
        padded = list(args) + [""] * (6 - len(args))  # (ARGV[7], park: '' is none)
        rec = self.r.fcall("queasy_dequeue", 1, self.B5r, *padded, "rec")
        assert rec[:2] == wide[:2], (args, rec, wide)
        jobs = [wide[k : k + 8] for k in range(2, len(wide), 8)]
        assert len(rec) - 2 == 3 * len(jobs), (args, rec, wide)
        for n, (id, token, data, run_at, retry, stall, timeout, trace) in enumerate(jobs):
            assert rec[2 + 3 * n : 4 + 3 * n] == [id, token], (args, rec, wide)
            record = rec[4 + 3 * n]
            assert record == before[id], (args, record, before[id])
            nums, r_trace, r_data = record.split("\t", 2)
            words = nums.split(" ")
            assert (words[0], *words[2:5]) == (run_at, retry, stall, timeout), (record, wide)
            assert (r_trace, r_data) == (trace, data), (record, wide)
        old, new = state(self.r, self.B5), state(self.r, self.B5r)
        assert old == new, (args, old, new)
        for key in self.r.scan_iter(match=self.B5r + ":*", count=1000):
            self.r.unlink(key)

    def check(self) -> None:
        """The stored states are equal (4.4.0's as 5.0 holds it)."""
        for b4, b5 in ((self.B4, self.B5), (self.F4, self.F5)):
            old, new = as_layout5(self.r, b4), state(self.r, b5)
            for name in set(old) & set(new):
                if name.startswith(":lease:"):  # (the forms of 4.x and 5.1.0: lease_key)
                    old[name], new[name] = leases_keyed(old[name]), leases_keyed(new[name])
            for name in sorted(set(old) | set(new)):
                assert old.get(name) == new.get(name), (name, old.get(name), new.get(name))
            for name in old:  # a kept record's fields in 4.4.0's order (a small hash's)
                small = {self.r.object("encoding", b + name) for b in (b4, b5)} == {"listpack"}
                if name.startswith(":ended:") and small:
                    ended = state_of(self.r, b4, name[len(":ended:") :])
                    fields = list(ended_hash(self.r.hgetall(b4 + name), ended))
                    got = list(self.r.hgetall(b5 + name))
                    assert fields == got, (name, fields, got)
