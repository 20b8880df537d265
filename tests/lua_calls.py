"""Raw FCALLs of the queasy Lua library for tests: one thin wrapper per function.

Time is explicit: every call passes `now` (ms), defaulting to NOW, so tests move the clock by
passing later values instead of sleeping.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import redis

from queasy_py.records import COUNTS
from queasy_py.store import events
from queasy_py.store.keys import QueueKeys

NOW = 1_700_000_000_000  # ms: the tests' clock
EXPIRY = 10_000  # ms a client stays alive after a dequeue or bump
MAXLEN = 1000  # events kept per queue
KEEP = (100, 3_600_000)  # records of ended jobs kept: count, ms
HOST = "test-host"

JOB_COUNTS = ("retry_count", "stall_count", "timeout_count")


@dataclass(frozen=True)
class Leased:
    """One job of a dequeue reply."""

    id: str
    token: str
    data: str
    run_at: int
    retry_count: int
    stall_count: int
    timeout_count: int
    trace: str = ""  # the traceparent of its dispatch ('' none)


@dataclass(frozen=True)
class Checkout:
    """A dequeue reply: status (0 ok, 2 swept), next_run_at ('' if none) and the jobs."""

    status: int
    next_run_at: str
    jobs: list[Leased]

    @property
    def ids(self) -> list[str]:
        return [job.id for job in self.jobs]


def live(counts: dict[str, int]) -> dict[str, int]:
    """The jobs per live state of a counts() dict (waiting, delayed, blocked, active)."""
    return {k: v for k, v in counts.items() if k in COUNTS[:4]}


class Lua:
    """FCALLs on queue `q` (base key B) and its fail queue `q-fail` (base key F, same tag)."""

    def __init__(self, r: redis.Redis, prefix: str, queue: str = "q") -> None:
        self.r = r
        self.B = QueueKeys(prefix, queue, queue).base
        self.F = QueueKeys(prefix, queue + "-fail", queue).base
        self._nonces = itertools.count(1)

    def call(self, name: str, keys: list[str], *args: Any) -> Any:
        return self.r.fcall(name, len(keys), *keys, *args)

    # ---------------------------------------------------------------- producer side

    def dispatch(
        self,
        *jobs: tuple[str, str, Any],
        now: int = NOW,
        update_data: bool = True,
        run_at_mode: str = "replace",
        reset: bool | None = None,
        trace: str = "",
    ) -> list[int]:
        """Dispatch (id, data JSON, run_at ms or '') triples; returns one code per job."""
        reset = update_data if reset is None else reset
        flat = [part for job in jobs for part in job]
        flags = [int(update_data), run_at_mode, int(reset)]
        return self.call("queasy_dispatch", [self.B], now, *flags, trace, *flat)

    def dispatch_once(
        self,
        *jobs: tuple[str, str, Any],
        window: Any,
        now: int = NOW,
        update_data: bool = True,
        run_at_mode: str = "replace",
        reset: bool | None = None,
    ) -> list[int]:
        """queasy_dispatch_once of (id, data JSON, run_at ms or '') triples with a window (ms)."""
        reset = update_data if reset is None else reset
        flat = [part for job in jobs for part in job]
        flags = [int(update_data), run_at_mode, int(reset)]
        return self.call("queasy_dispatch_once", [self.B], now, *flags, window, *flat)

    def add(self, id: str, data: str = '"x"', run_at: Any = NOW, **flags: Any) -> int:
        """Dispatch one job; returns its code."""
        return self.dispatch((id, data, run_at), **flags)[0]

    def cancel(
        self, id: str, now: int = NOW, maxlen: int = MAXLEN, keep: tuple[int, int] = KEEP
    ) -> int:
        return self.call("queasy_cancel", [self.B], now, maxlen, id, *keep)

    def record(self, id: str, now: int = NOW, base: str | None = None) -> dict[str, Any] | None:
        """queasy_get_job as {"state": ..., **the record's fields} (strings), or None."""
        row = self.call("queasy_get_job", [base or self.B], now, id)
        if row is None:
            return None
        state, flat = row
        return {"state": state, **dict(zip(flat[0::2], flat[1::2], strict=True))}

    def get_job(self, id: str, now: int = NOW, base: str | None = None) -> dict[str, Any] | None:
        """The state, id, data, run_at and counts of job `id` (ints), or None."""
        rec = self.record(id, now, base)
        if rec is None:
            return None
        out = {"state": rec["state"], "id": rec["id"], "data": rec.get("data")}
        out["run_at"] = int(rec["run_at"])
        return out | {name: int(rec[name]) for name in JOB_COUNTS}

    def counts(self, now: int = NOW, base: str | None = None) -> dict[str, int]:
        """The live states only (COUNTS[:4]); all of queasy_counts: counts_all()."""
        return {k: v for k, v in self.counts_all(now, base).items() if k in COUNTS[:4]}

    def counts_all(self, now: int = NOW, base: str | None = None) -> dict[str, int]:
        row = self.call("queasy_counts", [base or self.B], now)
        return dict(zip(COUNTS, row, strict=True))

    def jobs(
        self, state: str, cursor: str = "0", limit: int = 10, now: int = NOW, data: bool = False
    ) -> tuple[str, list[tuple[str, dict[str, str]]]]:
        """One page of queasy_jobs: (next cursor, [(state, fields), ...])."""
        row = self.call("queasy_jobs", [self.B], now, state, cursor, limit, int(data))
        pages = [(st, dict(zip(flat[0::2], flat[1::2], strict=True))) for st, flat in row[1:]]
        return row[0], pages

    def requeue(self, *ids: str, now: int = NOW, cutoff: Any = "", limit: int = 100) -> list[int]:
        return self.call("queasy_requeue", [self.B], now, cutoff, limit, *ids)

    def purge(self, state: str, limit: int = 100, now: int = NOW) -> int:
        return self.call("queasy_purge", [self.B], now, state, limit)

    # ---------------------------------------------------------------- consumer side

    def dequeue(
        self,
        client: str = "c1",
        limit: int = 10,
        now: int = NOW,
        expiry: int = EXPIRY,
        maxlen: int = MAXLEN,
        park: bool = False,
    ) -> Checkout:
        nonce = f"n{next(self._nonces)}"
        args = [now, client, nonce, limit, expiry, maxlen, int(park)]
        row = self.call("queasy_dequeue", [self.B], *args)
        status, next_run_at, rest = row[0], row[1], row[2:]
        jobs = [
            Leased(id, token, data, int(run_at), int(r), int(s), int(t), trace)
            for id, token, data, run_at, r, s, t, trace in zip(*[iter(rest)] * 8, strict=True)
        ]
        return Checkout(status, next_run_at, jobs)

    def take(self, id: str, client: str = "c1", now: int = NOW, **dispatch_flags: Any) -> Leased:
        """Dispatch job `id` at `now` and dequeue it for `client`; returns its lease."""
        self.add(id, run_at=now, **dispatch_flags)
        checkout = self.dequeue(client, limit=1, now=now)
        assert checkout.ids == [id]
        return checkout.jobs[0]

    def bump(self, client: str, now: int = NOW, expiry: int = EXPIRY, maxlen: int = MAXLEN) -> int:
        return self.call("queasy_bump", [self.B], now, client, expiry, maxlen)

    def leave(self, client: str, now: int = NOW) -> int:
        return self.call("queasy_leave", [self.B], now, client)

    def unpark(self, client: str, mark: str, now: int = NOW) -> list[int]:
        return self.call("queasy_unpark", [self.B], now, client, mark)

    def parked(self) -> dict[str, int]:
        """Client id -> parked slots (B:parked)."""
        return {k: int(v) for k, v in self.r.hgetall(self.B + ":parked").items()}

    def finish(
        self,
        client: str,
        job: Leased,
        now: int = NOW,
        token: str | None = None,
        pid: str = "42",
        result: str = "",
        keep: tuple[int, int] = KEEP,
        notify: bool = False,
    ) -> int:
        head = [now, client, MAXLEN, *keep, HOST, int(notify)]
        args = [job.id, token or job.token, pid, now - 5, result]
        return self.call("queasy_finish", [self.B], *head, *args)[0]

    def retry(
        self,
        client: str,
        job: Leased,
        run_at: int,
        kind: str = "retry",
        now: int = NOW,
        token: str | None = None,
        message: str = "bad value",
        traceback: str = "Traceback ...\nValueError: bad value\n",
    ) -> int:
        args = [job.id, token or job.token, run_at, kind, "42", now - 5, "ValueError"]
        args += [message, traceback]
        return self.call("queasy_retry", [self.B], now, client, MAXLEN, *args)[0]

    def fail(
        self,
        client: str,
        job: Leased,
        fail_id: str = "f1",
        fail_data: str = '"fail data"',
        now: int = NOW,
        token: str | None = None,
        with_fail_queue: bool = True,
        keep: tuple[int, int] = KEEP,
        notify: bool = False,
        message: str = "no such key",
        traceback: str = "Traceback ...\nKeyError: no such key\n",
    ) -> int:
        keys = [self.B, self.F] if with_fail_queue else [self.B]
        data = fail_data if with_fail_queue else ""
        head = [now, client, MAXLEN, *keep, HOST, int(notify)]
        args = [job.id, token or job.token, fail_id, data, "42", now - 5, "KeyError", "permanent"]
        args += [message, traceback]
        return self.call("queasy_fail", keys, *head, *args)[0]

    # ---------------------------------------------------------------- inspection

    def events(self) -> list[dict[str, str]]:
        key = self.B + ":events"
        return [events.fields_of(raw, events.queue_of(key)) for _, raw in self.r.xrange(key)]


def snapshot(r: redis.Redis, prefix: str) -> dict[str, Any]:
    """Every key under `prefix` with its type and value, to assert that nothing changed."""
    readers = {
        "hash": r.hgetall,
        "zset": lambda key: r.zrange(key, 0, -1, withscores=True),
        "set": lambda key: sorted(r.smembers(key)),
        "stream": r.xrange,
        "string": r.get,
    }
    out = {}
    for key in sorted(r.scan_iter(match=f"{prefix}:*")):
        kind = r.type(key)
        out[key] = (kind, readers[kind](key))
    return out


#: the fields of every outcome event (lua/queasy.lua, outcome_event)
EVENT_FIELDS = {
    "id",
    "queue",
    "outcome",
    "run_at",
    "started_at",
    "ended_at",
    "client",
    "pid",
    "retry_count",
    "stall_count",
    "timeout_count",
    "error_name",
    "error_kind",
    "error_message",
    "traceback",
    "enqueued_at",
}


# ---------------------------------------------------------------- schedules (queasy_schedule)

SCHEDULE_ID = "schedule"  # the occurrence's id (lua/queasy.lua SCHEDULE_ID)


@dataclass(frozen=True)
class Scheduled:
    """A queasy_schedule reply: code (0 nothing, 1 stale, 2 created, 3 moved), and after the
    call B:schedule's fire_at, spec, last_fire_at (None when unset) and the occurrence's state."""

    code: int
    fire_at: int | None
    spec: str
    last_fire_at: int | None
    state: str


def schedule(
    lua: Lua,
    seen: Any,
    create_at: Any,
    retime_at: Any = "",
    spec: str = "every 1s",
    skipped: Any = 0,
    skipped_move: Any = 0,
    now: Any = NOW,
) -> Scheduled:
    """queasy_schedule on `lua`'s queue; `seen` None is '' (no fire time seen)."""
    args = [now, spec, "" if seen is None else seen, create_at, retime_at, skipped, skipped_move]
    code, fire_at, got_spec, last, state = lua.call("queasy_schedule", [lua.B], *args)
    return Scheduled(
        code,
        int(fire_at) if fire_at else None,
        got_spec,
        int(last) if last else None,
        state,
    )


def schedule_info(lua: Lua, now: int = NOW) -> dict[str, str] | None:
    row = lua.call("queasy_schedule_info", [lua.B], now)
    if row is None:
        return None
    names = ("spec", "fire_at", "state", "last_fire_at", "last_outcome", "last_ended_at")
    return dict(zip((*names, "skipped"), row, strict=True))
