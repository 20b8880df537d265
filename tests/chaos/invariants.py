"""What the chaos test reads (handler records, outcome events, the orchestrator's own log of
disruptions) and the invariants it checks over them.

Words. An *attempt* is one start of a handler (a start record: queue, id, worker pid, its
supervisor's pid, start time t, the counts and run_at it saw, and the lease holder of the job's
active record when it began). Its *end* is the first of: its own end/exit record; a SIGKILL we
sent to its worker or its supervisor's group; an outcome event of the job naming its worker
pid as gone (timed_out, stalled, released: sent once that worker is dead, or for a result
that raced its timeout, once the handler returned); a sweep of
its lease (outcome stalled with no pid, by the client that held it). An attempt is a *zombie*
when its supervisor no longer held the job's lease when it began and a sweep of that
supervisor explains why (the group was frozen, swept, and its worker ran on after SIGCONT).

  1. Mutual exclusion: when an attempt L of (queue, id) starts, every earlier attempt E of it
     has ended, unless L is a zombie. A non-zombie attempt without the lease is a violation.
  2. No re-run: a job with a unique id (work and fail queues) has at most one terminal outcome
     (finished or failed), and no non-zombie attempt starts after it. Periodic ids are exempt:
     queasy_py.handlers.reschedule re-dispatches their old data on purpose.
  3. No early start: t >= run_at - 50 ms, and for work jobs t >= the not-before of the dispatch.
  4. Nothing lost (after the drain): every dispatched work job has a `finished` outcome or
     its fail handler started with its id; every `failed` outcome reached a fail handler (a
     periodic job's once it is GRACE old: periodic jobs keep running through the drain); the
     work queues and their fail queues are empty.
  5. Periodic ids live: each one starts at least once in every PERIODIC_WINDOW seconds of the
     server's up-time (the time of server faults inside a gap is left out, as for 8d).
  6. Progress: while the highest-priority queue has ready jobs, some job of it starts at least
     once every PROGRESS_WINDOW seconds.
  7. Hostile input refused (tests/chaos/hostile.py flags it): every raw FCALL of the hostile
     producer is refused with INVALID (or by a fault of the server) and writes nothing, not
     even the valid job put before the bad one; every bad public-API dispatch raises
     InvalidInput and writes nothing.
  8. Schedules (tests/chaos/schedules.py): every fire time of a scheduled queue since start
     ran exactly once (one terminal outcome), or is the one pending, or catch-up passed over
     it while it could not run (its previous occurrence still ran, the server had a fault, or
     a supervisor logged moving it once it could not start in time); fire times are on the
     schedule's grid, never run out of order, and each scheduled queue starts at least once
     in every PERIODIC_WINDOW seconds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .cluster import Disruption, Freeze
from .handlers import SCHEDULED, WORK_QUEUES

EARLY_TOLERANCE = 0.05
PERIODIC_WINDOW = 10.0
PROGRESS_WINDOW = 15.0
#: slack for times stored in whole milliseconds
MS = 0.002


def client_pid(client: str) -> int | None:
    """Client ids are `<pid>-<hex>`: the pid of the supervisor process."""
    head = client.split("-", 1)[0]
    return int(head) if head.isdigit() else None


@dataclass
class Attempt:
    q: str
    id: str
    serial: str
    pid: int
    ppid: int
    t: float
    run_at: float
    counts: tuple[int, int, int]
    nb: float | None
    act: str
    holder: str  # client id in the active record at start ("" if none)
    leased_at: float | None
    extra: dict[str, str]
    end: float | None = None
    checked: bool = False

    @property
    def held_lease(self) -> bool:
        return bool(self.holder) and client_pid(self.holder) == self.ppid

    def describe(self) -> str:
        return (
            f"[{self.act} pid {self.pid} of {self.ppid} at {self.t:.3f} "
            f"counts {self.counts} holder {self.holder or '-'} end {self.end}]"
        )


@dataclass
class Event:
    outcome: str
    ended: float  # seconds
    pid: str
    client: str
    counts: tuple[int, int, int]


@dataclass
class Records:
    """Everything read so far."""

    attempts: dict[tuple[str, str], list[Attempt]] = field(
        default_factory=lambda: defaultdict(list)
    )
    open: dict[tuple[str, str, int], Attempt] = field(default_factory=dict)
    events: dict[tuple[str, str], list[Event]] = field(default_factory=lambda: defaultdict(list))
    intents: dict[str, tuple[str, str]] = field(default_factory=dict)  # serial -> (q, id)
    confirmed: set[str] = field(default_factory=set)
    fail_reached: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    last_start: dict[str, float] = field(default_factory=dict)  # queue -> latest start
    periodic_starts: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    new: list[Attempt] = field(default_factory=list)
    starts: int = 0

    def add_record(self, row: dict[str, str]) -> None:
        ev = row["ev"]
        if ev == "start":
            self._start(row)
        elif ev in ("end", "exit"):
            attempt = self.open.pop((row["q"], row["id"], int(row["pid"])), None)
            if attempt is not None:
                attempt.end = float(row["t"])
        elif ev == "intent":
            self.intents[row["serial"]] = (row["q"], row["id"])
        elif ev == "dispatched":
            self.confirmed.add(row["serial"])

    def add_dispatch(self, serial: str, q: str, job_id: str) -> None:
        self.intents[serial] = (q, job_id)
        self.confirmed.add(serial)

    def _start(self, row: dict[str, str]) -> None:
        names = ("oq", "oid", "oserial", "err", "kind", "fire", "ofire")
        extra = {k: row[k] for k in names if k in row}
        attempt = Attempt(
            q=row["q"],
            id=row["id"],
            serial=row["serial"],
            pid=int(row["pid"]),
            ppid=int(row["ppid"]),
            t=float(row["t"]),
            run_at=float(row["run_at"]),
            counts=(int(row["rc"]), int(row["sc"]), int(row["tc"])),
            nb=float(row["nb"]) if row.get("nb") else None,
            act=row["act"],
            holder=row.get("lc", ""),
            leased_at=int(row["lt"]) / 1000.0 if row.get("lt") else None,
            extra=extra,
        )
        self.starts += 1
        self.attempts[(attempt.q, attempt.id)].append(attempt)
        self.open[(attempt.q, attempt.id, attempt.pid)] = attempt
        self.new.append(attempt)
        self.last_start[attempt.q] = max(self.last_start.get(attempt.q, 0.0), attempt.t)
        if attempt.q == "periodic":
            self.periodic_starts[attempt.id].append(attempt.t)
        if "oid" in extra:
            self.fail_reached[(extra["oq"], extra["oid"])].add(attempt.id)

    def add_event(self, row: dict[str, str]) -> None:
        self.events[(row["queue"], row["id"])].append(
            Event(
                outcome=row["outcome"],
                ended=int(row["ended_at"]) / 1000.0,
                pid=row["pid"],
                client=row["client"],
                counts=(
                    int(row["retry_count"]),
                    int(row["stall_count"]),
                    int(row["timeout_count"]),
                ),
            )
        )


def is_work(q: str) -> bool:
    return q in WORK_QUEUES


def unique_ids(q: str) -> bool:
    """Queues whose job ids are never dispatched twice (all but the periodic and the
    scheduled ones)."""
    return q != "periodic" and q not in SCHEDULED


@dataclass
class Checker:
    records: Records
    kills: list[Disruption]
    freezes: list[Freeze]
    violations: dict[tuple[Any, ...], str] = field(default_factory=dict)
    fresh: list[str] = field(default_factory=list)

    def flag(self, key: tuple[Any, ...], message: str) -> None:
        if key not in self.violations:
            self.violations[key] = message
            self.fresh.append(message)

    # ---------------------------------------------------------------- ends and sweeps

    def sweep_of(self, a: Attempt) -> Event | None:
        """The sweep that took the lease of `a` away, if any."""
        for e in self.records.events.get((a.q, a.id), ()):
            if e.outcome != "stalled" or e.pid != "":
                continue
            if a.held_lease:
                if e.client == a.holder and e.ended >= (a.leased_at or 0.0) - MS:
                    return e
            elif (
                client_pid(e.client) == a.ppid
                and e.counts == (a.counts[0], a.counts[1] + 1, a.counts[2])
                and e.ended >= a.t - 60.0
            ):
                return e
        return None

    def zombie(self, a: Attempt) -> bool:
        return not a.held_lease and self.sweep_of(a) is not None

    def ended_by(self, a: Attempt, at: float) -> bool:
        if a.end is not None and a.end <= at + MS:
            return True
        for k in self.kills:
            if a.t - MS <= k.t <= at and (
                (k.kind == "group" and k.pid == a.ppid) or (k.kind == "worker" and k.pid == a.pid)
            ):
                return True
        for e in self.records.events.get((a.q, a.id), ()):
            if (
                e.outcome in ("timed_out", "stalled", "released")
                and e.pid == str(a.pid)
                and a.t - MS <= e.ended <= at + MS
            ):
                return True
        sweep = self.sweep_of(a)
        return sweep is not None and sweep.ended <= at + MS

    # ---------------------------------------------------------------- invariants

    def check_start(self, late: Attempt) -> None:
        """Invariants 1, 2 and 3 for one attempt, against everything known before it."""
        key = (late.q, late.id)
        zombie = self.zombie(late)
        if not late.held_lease and not zombie:
            self.flag(
                (1, "lease", key, late.t),
                f"1 mutual exclusion: {late.q} {late.id} started without its lease and no "
                f"sweep explains it {late.describe()}",
            )
        if not zombie:
            for early in self.records.attempts[key]:
                if early is late or early.t > late.t:
                    continue
                if not self.ended_by(early, late.t):
                    self.flag(
                        (1, key, early.t, late.t),
                        f"1 mutual exclusion: {late.q} {late.id} started {late.describe()} "
                        f"while {early.describe()} still held it",
                    )
        if unique_ids(late.q):
            for e in self.records.events.get(key, ()):
                if e.outcome in ("finished", "failed") and late.t > e.ended + MS:
                    sweep = self.sweep_of(late) if zombie else None
                    if sweep is None or sweep.ended > e.ended + MS:
                        self.flag(
                            (2, key, late.t),
                            f"2 no re-run: {late.q} {late.id} started {late.describe()} after "
                            f"its {e.outcome} outcome at {e.ended:.3f}",
                        )
        if late.t < late.run_at - EARLY_TOLERANCE:
            self.flag(
                (3, key, late.t),
                f"3 early start: {late.q} {late.id} started {late.run_at - late.t:.3f}s before "
                f"its run_at {late.describe()}",
            )
        if late.nb is not None and late.t < late.nb - EARLY_TOLERANCE:
            self.flag(
                (3, "nb", key, late.t),
                f"3 early start: {late.q} {late.id} started {late.nb - late.t:.3f}s before the "
                f"not-before of its dispatch {late.describe()}",
            )

    def check_terminals(self) -> None:
        for key, events in self.records.events.items():
            if not unique_ids(key[0]):
                continue
            ends = [e for e in events if e.outcome in ("finished", "failed")]
            if len(ends) > 1:
                self.flag(
                    (2, "twice", key),
                    f"2 no re-run: {key[0]} {key[1]} ended {len(ends)} times: "
                    + ", ".join(f"{e.outcome} by {e.client} at {e.ended:.3f}" for e in ends),
                )

    def check_continuous(self, horizon: float) -> None:
        """Check attempts that started before `horizon` and were not checked yet."""
        keep = []
        for a in self.records.new:
            if a.t <= horizon:
                self.check_start(a)
                a.checked = True
            else:
                keep.append(a)
        self.records.new = keep
        self.check_terminals()

    def check_all(self) -> None:
        for attempts in self.records.attempts.values():
            for a in attempts:
                self.check_start(a)
        self.records.new = []
        self.check_terminals()

    def check_periodic(
        self, ids: list[str], since: float, now: float, faults: Sequence[tuple[float, float]] = ()
    ) -> None:
        """Invariant 5: a gap between two starts counts the time the server was up; the time
        of server faults (`faults`: (began, lifted) each) inside it is left out, as 8d does:
        no job starts while the server is frozen, refuses writes or times out."""
        for job_id in ids:
            times = sorted(t for t in self.records.periodic_starts.get(job_id, ()) if t >= since)
            points = [since, *times, now]
            for before, after in zip(points, points[1:], strict=False):
                down = sum(max(0.0, min(e, after) - max(b, before)) for b, e in faults)
                if after - before - down > PERIODIC_WINDOW:
                    self.flag(
                        (5, job_id, round(before, 3)),
                        f"5 periodic: {job_id} did not start for {after - before:.1f}s, "
                        f"{down:.1f}s of it with the server faulted (from {before:.3f})",
                    )

    def check_lost(self, counts: dict[str, dict[str, int]], settled: float) -> dict[str, int]:
        """Invariant 4, after the drain. Returns a tally of how dispatched jobs ended.

        Periodic jobs keep running (and failing) through the drain and the final read: their
        failures count once they ended before `settled`, so a fail job still on its way to a
        worker at the final read is not taken for lost."""
        r = self.records
        tally = {"finished": 0, "failed": 0, "unconfirmed": 0}
        for serial, (q, job_id) in r.intents.items():
            if not is_work(q):
                continue
            key = (q, job_id)
            finished = any(e.outcome == "finished" for e in r.events.get(key, ()))
            if finished:
                tally["finished"] += 1
            elif r.fail_reached.get(key):
                tally["failed"] += 1
            elif serial not in r.confirmed and key not in r.attempts and key not in r.events:
                tally["unconfirmed"] += 1  # its dispatcher was killed before it dispatched
            else:
                history = ", ".join(
                    f"{e.outcome}@{e.ended:.3f}/{e.client}/{e.pid}" for e in r.events.get(key, ())
                )
                starts = " ".join(a.describe() for a in r.attempts.get(key, ()))
                self.flag(
                    (4, key),
                    f"4 lost: {q} {job_id} neither finished nor reached its fail handler "
                    f"(events: {history or 'none'}; starts: {starts or 'none'})",
                )
        for key, events in r.events.items():
            failed = sum(
                1
                for e in events
                if e.outcome == "failed" and (is_work(key[0]) or e.ended <= settled)
            )
            if failed and len(r.fail_reached.get(key, ())) < failed:
                self.flag(
                    (4, "fail", key),
                    f"4 lost: {key[0]} {key[1]} failed {failed} time(s) but its fail handler "
                    f"started for {len(r.fail_reached.get(key, ()))}",
                )
        for name, c in counts.items():
            if any(c.values()):
                self.flag(
                    (4, "queue", name), f"4 lost: queue {name} not empty after the drain: {c}"
                )
        return tally
