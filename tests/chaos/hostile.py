"""A hostile producer mixed into the chaos load (issue #18): anyone who may PUBLISH and FCALL
on the queues' keys, using the documented key layout (lua/queasy.lua) and the public API.

  wake      PUBLISH garbage on a queue's wake channel `<base>:wake`
  push      PUBLISH malformed job messages on a supervisor's push channel
            `<base>:push:<client id>` (ids from `<base>:parked` and `<base>:expiry`); every
            message has a field that is not a non-negative integer, so none is a job
  forge     (opt-in: forge=True) PUBLISH a well-formed push of a waiting job, with a made-up
            token: the supervisor runs it without a lease (a known weakness, invariant 1
            flags it); off by default
  fcall     raw FCALL queasy_dispatch with non-JSON data, bad times, ids with whitespace or
            control characters, bad flags, partial triples; some calls put a valid job first:
            the library must refuse the whole call (INVALID) and write nothing of it
  api       public-API dispatches with out-of-range times or bad ids: InvalidInput, nothing
            written (one dispatch_many mixes a valid job with a bad one)
  schedule  raw FCALL queasy_schedule with a bad spec, time or count, on a queue without a
            schedule: refused (INVALID), and neither a schedule nor an occurrence is written

A refused call is counted; a call that is accepted, a valid job of a refused call that was
written anyway, or a public-API dispatch that does not raise InvalidInput, is a violation
(invariant 7 of tests/chaos/invariants.py). A refusal by a fault of the server (OOM, no
library) is counted apart: the call never reached the library's checks.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from queasy_py import InvalidInput, Queue

from ..records import has_record, record
from .connect import open_redis
from .faults import missing_function, refused_write
from .handlers import SCHEDULED

WAKE_GARBAGE = [b"not-a-number", b"1e+20", b"-5", b"", b"\x00\xff\xfe", b"9" * 40, b"NaN", b" 1"]
PUSH_GARBAGE = [
    b"id\ntoken\nrun_at\nx\ny\nz\n{}",
    b"c-1\np1\n1e+20\n0\n0\n0\n{}",
    b"c-1\np1\n0\n-1\n0\n0\n{}",
    b"c-1\np1\n0\n0\n0\n\n{}",
    b"c-1\np1\n0\n0\nNaN\n0\n\xff\xfe",
    b"c-1\np1\n" + b"9" * 30 + b"\n0\n0\n0\n{}",
    b"\n\n\n\n\n\n",
    b"x" * 100_000,
]
BAD_DATA = ["{not json", "NaN", "[1, Infinity]", "0x10", "{'a': 1}", "", "\xff"]
BAD_TIMES = ["1.5", "1e3", "-1", "253402300800000", "abc", " 5", "+7", "inf"]
BAD_IDS = ["a\nb", "a b", "", "x" * 257, "a\x00b", "tab\there", "\r"]
BAD_FLAGS = [("2", "replace", "0"), ("1", "sometimes", "0"), ("1", "replace", "yes")]
API_RUN_AT: list[Any] = [-1, 253402300800, 1e306, float("inf"), float("nan"), 10**30, "soon"]
API_DELAY: list[Any] = [-1e12, 1e300, float("inf"), float("nan"), 10**400]


class Hostile:
    def __init__(
        self,
        url: str,
        queues: dict[str, Queue],
        rng: random.Random,
        flag: Callable[[tuple[Any, ...], str], None],
        seed: int,
        forge: bool = False,
    ) -> None:
        self.r = open_redis(url, socket_timeout=5.0, retry=Retry(NoBackoff(), 0))
        self.queues = queues
        self.rng = rng
        self.flag = flag
        self.seed = seed
        self.forge_pushes = forge
        self.n = 0
        self.counts = {
            "wake": 0,
            "push": 0,
            "fcall_refused": 0,
            "api_refused": 0,
            "schedule_refused": 0,
            "faulted": 0,  # refused by OOM or a flushed library, not by the library's checks
        }
        if forge:
            self.counts["forged"] = 0

    def act(self) -> None:
        """One hostile action, chosen at random."""
        self.n += 1
        kinds = ("wake", "push", "fcall", "api", "schedule")
        kind = self.rng.choices(kinds, (2, 3, 4, 2, 2))[0]
        if self.forge_pushes and self.rng.random() < 0.2:
            kind = "forge"
        queue = self.rng.choice(list(self.queues.values()))
        getattr(self, kind)(queue)

    # ---------------------------------------------------------------- pub/sub

    def wake(self, queue: Queue) -> None:
        for message in self.rng.sample(WAKE_GARBAGE, 3):
            self.r.spublish(queue.keys.wake, message)
            self.counts["wake"] += 1

    def push(self, queue: Queue) -> None:
        base = queue.keys.base
        clients = {c.decode() for c in self.r.hkeys(f"{base}:parked")}
        clients |= {c.decode() for c in self.r.zrange(f"{base}:expiry", 0, -1)}
        for client in sorted(clients):
            for message in self.rng.sample(PUSH_GARBAGE, 2):
                self.r.spublish(queue.keys.push(client), message)
                self.counts["push"] += 1

    def forge(self, queue: Queue) -> None:
        base = queue.keys.base
        clients = sorted(c.decode() for c in self.r.hkeys(f"{base}:parked"))
        waiting = self.r.zrange(queue.keys.waiting, 0, 0)
        if not clients or not waiting:
            return
        job_id = waiting[0].decode()
        stored = record(self.r, base, job_id)
        if stored is None:
            return
        message = f"{job_id}\nforged{self.n}\n0\n0\n0\n0\n\n{stored['data']}".encode()  # no trace
        self.r.spublish(queue.keys.push(self.rng.choice(clients)), message)
        self.counts["forged"] += 1

    # ---------------------------------------------------------------- raw FCALL

    def _valid_triple(self) -> list[str]:
        return [f"h{self.seed}-{self.n}", '{"hostile": true}', ""]

    def _bad_args(self) -> tuple[list[str], str | None]:
        """ARGV of one hostile queasy_dispatch, and the id of a valid job put first, if any."""
        rng = self.rng
        flags = ["1", "replace", "0"]
        bad = [f"h{self.seed}-{self.n}-bad", '{"hostile": 1}', ""]
        what = rng.choice(("data", "time", "id", "flags", "partial"))
        if what == "data":
            bad[1] = rng.choice(BAD_DATA)
        elif what == "time":
            bad[2] = rng.choice(BAD_TIMES)
        elif what == "id":
            bad[0] = rng.choice(BAD_IDS)
        elif what == "flags":
            flags = list(rng.choice(BAD_FLAGS))
        else:
            bad = bad[:2]
        valid = self._valid_triple() if rng.random() < 0.5 and what != "flags" else []
        return ["", *flags, "", *valid, *bad], (valid[0] if valid else None)

    def fcall(self, queue: Queue) -> None:
        args, valid_id = self._bad_args()
        base = queue.keys.base
        try:
            reply = self.r.fcall("queasy_dispatch", 1, base, *args)
        except redis.ResponseError as exc:
            if str(exc).startswith("INVALID "):
                self.counts["fcall_refused"] += 1
            elif refused_write(exc) or missing_function(exc):
                self.counts["faulted"] += 1
            else:
                self.flag((7, "fcall-error", self.n), f"7 hostile: {args!r} got {exc}")
            self._nothing_written(queue, valid_id, args)
            return
        self.flag((7, "fcall", self.n), f"7 hostile: queasy_dispatch accepted {args!r}: {reply}")

    def _nothing_written(self, queue: Queue, valid_id: str | None, args: list[str]) -> None:
        if valid_id is None:
            return
        if has_record(self.r, queue.keys.base, valid_id):
            self.flag(
                (7, "half", self.n),
                f"7 hostile: a refused queasy_dispatch wrote its valid job {valid_id}: {args!r}",
            )

    # ---------------------------------------------------------------- public API

    def api(self, queue: Queue) -> None:
        rng = self.rng
        job_id = f"h{self.seed}-{self.n}"
        data = {"hostile": self.n}
        case = rng.choice(("run_at", "delay", "id", "many"))
        try:
            if case == "run_at":
                queue.dispatch(data, id=job_id, run_at=rng.choice(API_RUN_AT))
            elif case == "delay":
                queue.dispatch(data, id=job_id, delay=rng.choice(API_DELAY))
            elif case == "id":
                queue.dispatch(data, id=rng.choice(BAD_IDS))
            else:
                bad = {"data": data, "id": f"{job_id}-bad", "run_at": rng.choice(API_RUN_AT)}
                queue.dispatch_many([{"data": data, "id": job_id}, bad])
        except InvalidInput:
            self.counts["api_refused"] += 1
            if has_record(self.r, queue.keys.base, job_id):
                self.flag((7, "api-half", self.n), f"7 hostile: {case} wrote {job_id}")
            return
        self.flag((7, "api", self.n), f"7 hostile: a public-API dispatch ({case}) was accepted")

    # ---------------------------------------------------------------- schedules

    def schedule(self, queue: Queue) -> None:
        if queue.name in SCHEDULED:  # its supervisors write its schedule meanwhile
            return
        rng = self.rng
        args = ["", "every 1s", "", "1700000000000", "", "0", "0"]
        at = rng.choice((1, 2, 3, 4, 5, 6))  # spec, seen, create_at, retime_at, counts
        args[at] = rng.choice(["", "x\ny", "x" * 201]) if at == 1 else rng.choice(BAD_TIMES)
        if at == 5:
            args[at] = rng.choice(["-1", "x", "1.5"])
        try:
            reply = self.r.fcall("queasy_schedule", 1, queue.keys.base, *args)
        except redis.ResponseError as exc:
            if str(exc).startswith("INVALID "):
                self.counts["schedule_refused"] += 1
            elif refused_write(exc) or missing_function(exc):
                self.counts["faulted"] += 1
            else:
                self.flag((7, "schedule-error", self.n), f"7 hostile: {args!r} got {exc}")
            written = has_record(self.r, queue.keys.base, "schedule")
            if self.r.exists(queue.keys.schedule) or written:
                self.flag((7, "schedule-half", self.n), f"7 hostile: {args!r} wrote a schedule")
            return
        self.flag((7, "schedule", self.n), f"7 hostile: queasy_schedule accepted {args!r}: {reply}")

    def close(self) -> None:
        self.r.close()
