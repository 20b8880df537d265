"""A living job's stored state, read and written by tests on either key layout of the Lua
library. It mirrors the key table at the top of lua/queasy.lua:

  4.x   B:job:<id> (hash: the waiting/delayed record, or the blocked one while <id> is
        active, with u_* fields), B:active:<id> (hash: the active record), B:blocked (set of
        the blocked ids); a last error is fields of the record
  5.0   B:rec (hash: id -> "<run_at> <enqueued_at> <retry_count> <stall_count>
        <timeout_count> <attempts>\\t<trace>\\t<data>" of every waiting, delayed or active job;
        active: not in B:waiting), B:blocked (hash: id -> "<u_data> <u_reset> <u_run_at> <u_lo>
        <u_hi>\\t<record>"), B:err (hash: id -> JSON {name, kind, message, traceback, at}),
        B:layout ('5')

A record is given as 4.x's hash: id, data, run_at, enqueued_at, retry_count, stall_count,
timeout_count, attempts, trace, and error_name, error_kind, error_message, traceback, error_at
after a failed attempt (+ u_data, u_reset, u_run_at, u_lo, u_hi: a blocked one). A field 4.x
may leave out is absent from a 5.0 record when it holds 4.x's reading of absent: a count or
attempts '0', trace '', enqueued_at '-' (read counts with `.get(name, "0")`).

The layout is found on each call: 5.0 where B:layout or B:rec exists or B:blocked is a hash.
A queue without any of them has no living record in either layout (a writer then writes 4.x).
Tests of the 4.x layout itself (upgrades, tests/fixtures/queasy-*.lua) use its keys directly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.client import Pipeline
from redis.cluster import RedisCluster

Conn = redis.Redis | RedisCluster
Record = dict[str, str]

#: the numbers of a 5.0 record string, in order
NUMBERS = ("run_at", "enqueued_at", "retry_count", "stall_count", "timeout_count", "attempts")
#: 5.0's value of a field that 4.x leaves out of its hash
ABSENT = {"enqueued_at": "-", "retry_count": "0", "stall_count": "0", "timeout_count": "0"}
ABSENT |= {"attempts": "0", "trace": ""}
#: a 4.x error field -> its key in a 5.0 B:err entry
ERROR = {"error_name": "name", "error_kind": "kind", "error_message": "message"}
ERROR |= {"traceback": "traceback", "error_at": "at"}
#: the composed updates of a blocked record, in the order of a 5.0 B:blocked entry
UPDATES = ("u_data", "u_reset", "u_run_at", "u_lo", "u_hi")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def is_v5(r: Conn, base: str) -> bool:
    """Whether queue `base` is in the 5.0 layout."""
    if r.exists(f"{base}:layout", f"{base}:rec"):
        return True
    return _text(r.type(f"{base}:blocked")) == "hash"


# ---------------------------------------------------------------- 5.0 strings


def parse(job_id: str, value: str | bytes) -> Record:
    """A 5.0 record string of `job_id` as 4.x's hash (without its error)."""
    text = _text(value)
    parts = text.split("\t", 2)
    words = parts[0].split(" ")
    if len(parts) != 3 or len(words) != len(NUMBERS):
        raise ValueError(f"the record of job {job_id!r} is not a record string: {text!r}")
    out = {"id": job_id, "data": parts[2]}
    for name, word in (*zip(NUMBERS, words, strict=True), ("trace", parts[1])):
        if word != ABSENT.get(name):
            out[name] = word
    return out


def pack(fields: Mapping[str, str]) -> str:
    """The 5.0 record string of a record given as 4.x's hash (its run_at and data needed)."""
    if "run_at" not in fields or "data" not in fields:
        raise ValueError(f"a record needs run_at and data: {dict(fields)!r}")
    numbers = " ".join(fields.get(name, ABSENT.get(name, "")) for name in NUMBERS)
    return f"{numbers}\t{fields.get('trace', '')}\t{fields['data']}"


def parse_blocked(job_id: str, value: str | bytes) -> Record:
    """A 5.0 B:blocked entry as 4.x's blocked hash (its u_lo/u_hi '-' as 4.x's '')."""
    head, _, rest = _text(value).partition("\t")
    flags = head.split(" ")
    if len(flags) != len(UPDATES):
        raise ValueError(f"the blocked entry of job {job_id!r} is garbled: {_text(value)!r}")
    updates = dict(zip(UPDATES, flags, strict=True))
    for bound in ("u_lo", "u_hi"):
        updates[bound] = "" if updates[bound] == "-" else updates[bound]
    return parse(job_id, rest) | updates


def error_fields(value: str | bytes | None) -> Record:
    """A 5.0 B:err entry as 4.x's error fields ({} for none)."""
    if value is None:
        return {}
    err = json.loads(value)
    return {name: _text(err[key]) for name, key in ERROR.items() if key in err}


# ---------------------------------------------------------------- readers


def record(r: Conn, base: str, job_id: str) -> Record | None:
    """The waiting, delayed or active record of `job_id` with its last error, or None."""
    if is_v5(r, base):
        value, err = r.hget(f"{base}:rec", job_id), r.hget(f"{base}:err", job_id)
        if value is None and err is None:
            return None
        return (parse(job_id, value) if value is not None else {}) | error_fields(err)
    for key in (f"{base}:active:{job_id}", f"{base}:job:{job_id}"):
        fields = r.hgetall(key)
        if fields:
            return {_text(k): _text(v) for k, v in fields.items()}
    return None


def blocked_record(r: Conn, base: str, job_id: str) -> Record | None:
    """The record of `job_id` blocked behind its active one (with its u_* fields), or None."""
    if is_v5(r, base):
        value = r.hget(f"{base}:blocked", job_id)
        return None if value is None else parse_blocked(job_id, value)
    if not r.sismember(f"{base}:blocked", job_id):
        return None
    return {_text(k): _text(v) for k, v in r.hgetall(f"{base}:job:{job_id}").items()}


def is_active(r: Conn, base: str, job_id: str) -> bool:
    """Whether `job_id` has an active record."""
    if is_v5(r, base):
        leased = r.zscore(f"{base}:waiting", job_id) is None
        return bool(r.hexists(f"{base}:rec", job_id)) and leased
    return bool(r.exists(f"{base}:active:{job_id}"))


def has_record(r: Conn, base: str, job_id: str) -> bool:
    """Whether anything of a living record of `job_id` is stored (waiting, active, blocked)."""
    if is_v5(r, base):
        return any(r.hexists(f"{base}:{k}", job_id) for k in ("rec", "blocked", "err"))
    return bool(r.exists(f"{base}:job:{job_id}", f"{base}:active:{job_id}"))


@dataclass
class Living:
    """The living records of one queue in a dump of its keys: `records` as 4.x's B:job:<id>
    (the waiting/delayed ones and the blocked ones, these with u_* fields), `actives` as its
    B:active:<id>, and the ids of B:blocked."""

    records: dict[str, Record] = field(default_factory=dict)
    actives: dict[str, Record] = field(default_factory=dict)
    blocked: set[str] = field(default_factory=set)


def living(raw: Mapping[str, tuple[str, Any]], base: str) -> Living:
    """The living records of queue `base` in `raw` (key -> (type, value as read: a hash a
    dict, a set a set, a zset a list of (member, score))). 5.0: a record in B:rec is active
    when its id is not in B:waiting; an error of an id without a record is a record of its
    error fields only (as a 4.x hash holding only them)."""
    out = Living()
    kind, blocked = raw.get(f"{base}:blocked", ("none", {}))
    out.blocked = {_text(id) for id in blocked}
    if kind == "hash" or f"{base}:rec" in raw or f"{base}:layout" in raw:
        waiting = {_text(m) for m, _ in raw.get(f"{base}:waiting", ("zset", []))[1]}
        errors = {_text(k): v for k, v in raw.get(f"{base}:err", ("hash", {}))[1].items()}
        for id, value in raw.get(f"{base}:rec", ("hash", {}))[1].items():
            id = _text(id)
            rec = parse(id, value) | error_fields(errors.pop(id, None))
            (out.records if id in waiting else out.actives)[id] = rec
        for id, value in errors.items():
            out.records[id] = error_fields(value)
        for id, value in (blocked if kind == "hash" else {}).items():
            out.records[_text(id)] = parse_blocked(_text(id), value)
        return out
    for key, (_, value) in raw.items():
        for name, into in (("job", out.records), ("active", out.actives)):
            if key.startswith(f"{base}:{name}:"):
                into[key[len(base) + len(name) + 2 :]] = value
    return out


# ---------------------------------------------------------------- writers (around the library)


def garble(r: Conn, base: str, job_id: str, name: str, value: str | bytes | None) -> None:
    """Write field `name` of `job_id`'s waiting, delayed or active record around the library,
    as a raw HSET (None: as an HDEL). 5.0: the value goes into its place in the record string
    (or B:err) as it is, spaces and tabs included."""
    if not is_v5(r, base):
        keys = [k for k in (f"{base}:active:{job_id}", f"{base}:job:{job_id}") if r.exists(k)]
        if not keys:
            raise LookupError(f"job {job_id!r} has no record in {base}")
        if value is None:
            r.hdel(keys[0], name)
        else:
            r.hset(keys[0], name, value)
        return
    if name in ERROR:
        err = json.loads(r.hget(f"{base}:err", job_id) or "{}")
        err.pop(ERROR[name], None)
        if value is not None:
            err[ERROR[name]] = _text(value)
        if err:
            r.hset(f"{base}:err", job_id, json.dumps(err))
        else:
            r.hdel(f"{base}:err", job_id)
        return
    stored = r.hget(f"{base}:rec", job_id)
    if stored is None:
        raise LookupError(f"job {job_id!r} has no record in {base}")
    parts = _bytes(stored).split(b"\t", 2)
    words = parts[0].split(b" ")
    if value is None and name not in ABSENT:
        raise ValueError(f"a record always has its {name}")
    raw = _bytes(ABSENT[name] if value is None else value)
    if name in NUMBERS:
        words[NUMBERS.index(name)] = raw
    elif name in ("trace", "data"):
        parts[1 if name == "trace" else 2] = raw
    else:
        raise ValueError(f"a 5.0 record has no field {name!r}")
    r.hset(f"{base}:rec", job_id, b"\t".join([b" ".join(words), *parts[1:]]))


def put_record(
    r: Conn, base: str, job_id: str, fields: Mapping[str, str], into: Pipeline | None = None
) -> None:
    """Write `job_id`'s waiting or delayed record whole, as 4.x's hash `fields` (error fields
    included, no u_* field), around the library (the caller adds it to B:waiting). `into`: a
    pipeline to queue the writes on (the layout is read with `r`)."""
    out = r if into is None else into
    if any(name.startswith("u_") for name in fields):
        raise ValueError(f"a waiting record has no composed update: {dict(fields)!r}")
    if not is_v5(r, base):
        out.hset(f"{base}:job:{job_id}", mapping=dict(fields))
        return
    out.hset(f"{base}:rec", job_id, pack(fields))
    err = {key: fields[name] for name, key in ERROR.items() if name in fields}
    if err:
        out.hset(f"{base}:err", job_id, json.dumps(err))


def drop(r: Conn, base: str, job_id: str, into: Pipeline | None = None) -> None:
    """Delete every living record of `job_id` (waiting, active, blocked, its last error)
    around the library. `into`: as put_record's."""
    out = r if into is None else into
    if not is_v5(r, base):
        out.delete(f"{base}:job:{job_id}", f"{base}:active:{job_id}")
        return
    for name in ("rec", "blocked", "err"):
        out.hdel(f"{base}:{name}", job_id)
