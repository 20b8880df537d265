"""Invariant 8 of the chaos test: schedules (issue #16), checked at the end of a run.

A scheduled queue's occurrences (job id 'schedule') are strictly sequential: the next is
created only once the last one ended. So the k-th terminal outcome (a finished or failed
event, in time order) ends the k-th occurrence, and every attempt (handler start) of an
occurrence lies between the terminal outcome before it and its own.

  8a grid: every fire time seen (attempts, the fail handler's records, the pending one) is a
     fire time of the schedule: no drift.
  8b exactly once: the attempts (zombies aside) between two terminal outcomes have one fire
     time, and it grows from one occurrence to the next: no fire time ends twice or runs
     again after a later one ran (invariant 1 checks that two never run at once).
  8c nothing lost: a fire time of the schedule, from the first seen to the pending one, that
     no occurrence had, was passed over by catch-up while it could not run: the occurrence
     before it ended after it (it still ran, or waited for its retry), or a fault of the
     queue's server came within a period and SCHEDULE_GRACE of it, or a supervisor moved the
     pending occurrence past it (its log says so) once it could not start in time: not before
     SCHEDULE_GRACE after its fire time with catch_up "skip", after the next fire time's
     with "once" (a move any earlier is a violation).
  8d live: each scheduled queue starts at least once in every PERIODIC_WINDOW seconds of
     time its server was up: the time of the server's faults (frozen, refusing writes) in a
     gap is not counted (faults may follow one another: 4 s frozen, then 5 s refusing).
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from queasy_py import ScheduleInfo
from queasy_py.defaults import SCHEDULE_GRACE, SCHEDULE_ID
from queasy_py.options import ListenOptions
from queasy_py.runtime.schedules import Schedule, build

from .handlers import SCHEDULED
from .invariants import PERIODIC_WINDOW, Attempt, Checker, Event

#: seconds from an occurrence's end to the creation of the next (the same pipeline, or one
#: round more when a supervisor's view was stale)
CREATE_SLACK = 0.3


def schedule_of(queue: str) -> Schedule:
    listen = ListenOptions.build(queue, "tests.chaos.handlers.scheduled", SCHEDULED[queue], False)
    schedule = build(queue, listen)
    assert schedule is not None
    return schedule


#: a supervisor's log line of a catch-up move (runtime/schedules.py ScheduleCheck.on_reply)
MOVE = re.compile(
    r"^(\S+ \S+) \S+ WARNING schedule of (\S+): the occurrence of (\S+) could not start "
    r"in time; catch_up=\w+ moved it to (\S+)$"
)


def moves_in(logs: list[Path]) -> dict[str, list[tuple[float, float, float]]]:
    """(logged at, from fire time, to fire time) of each catch-up move, by queue."""
    out: dict[str, list[tuple[float, float, float]]] = {}
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            found = MOVE.match(line)
            if found is None:
                continue
            stamp, queue, old, new = found.groups()
            at = time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S"))
            at += int(stamp[20:23]) / 1000
            moved = [datetime.fromisoformat(x).timestamp() for x in (old, new)]
            out.setdefault(queue, []).append((at, moved[0], moved[1]))
    return out


def fire_of(a: Attempt) -> float:
    return float(a.extra["fire"])


def ended_before(e: Event, a: Attempt) -> bool:
    """Whether the terminal outcome `e` ended its occurrence before attempt `a` began.

    The next occurrence is created after the terminal FCALL, so its attempts start after the
    end; an attempt of this occurrence started before it, and ended before it too (its
    result went to the supervisor, which then acked). But an end is stored in whole
    milliseconds (the server's TIME, truncated): an attempt that began within the millisecond
    of `ended` and ended past it is the next occurrence's (the same worker may start it
    within that millisecond); one that began and ended within it is the one `e` ended when
    its worker is the one `e` names (a job shorter than a millisecond, acked within it), and
    an attempt of the next occurrence otherwise (two attempts of one occurrence never run at
    once: invariant 1)."""
    if a.t >= e.ended + 0.001:
        return True
    if a.t < e.ended:
        return False
    if a.end is not None and a.end >= e.ended + 0.001:
        return True
    return e.pid != str(a.pid)


def check_schedule(
    checker: Checker,
    queue: str,
    info: ScheduleInfo | None,
    faults: list[tuple[float, float]],
    moves: list[tuple[float, float, float]],
    since: float,
    now: float,
) -> dict[str, Any]:
    """Invariant 8 for one scheduled queue; returns a tally of its fire times."""
    schedule = schedule_of(queue)
    records = checker.records
    attempts = sorted(records.attempts.get((queue, SCHEDULE_ID), []), key=lambda a: a.t)
    failed = [
        float(a.extra["ofire"])
        for (q, _), found in records.attempts.items()
        if q == queue + "-fail"
        for a in found
        if a.extra.get("oid") == SCHEDULE_ID and a.extra.get("ofire")
    ]
    pending = info.fire_at if info is not None else None
    fires = sorted({*(fire_of(a) for a in attempts), *failed, *([pending] if pending else [])})
    key = (queue, SCHEDULE_ID)

    def flag(tag: Any, message: str) -> None:
        checker.flag((8, queue, tag), f"8 schedule: {queue} {message}")

    for fire in fires:  # 8a
        ms = round(fire * 1000)
        if schedule.latest(ms) != ms:
            flag(("grid", fire), f"fire time {fire:.3f} is not one of {schedule.text!r}")
    # 8b: attempts split by the terminal outcomes, one fire time per occurrence, growing
    terminal = sorted(
        (e for e in records.events.get(key, ()) if e.outcome in ("finished", "failed")),
        key=lambda e: e.ended,
    )
    ends = [e.ended for e in terminal]
    inside: list[list[Attempt]] = [[] for _ in range(len(terminal) + 1)]
    for a in attempts:
        if not checker.zombie(a):
            inside[sum(1 for e in terminal if ended_before(e, a))].append(a)
    ended_at: dict[float, float] = {}  # fire time -> end of its occurrence
    last_fire = float("-inf")
    for k, runs in enumerate(inside):
        high = ends[k] if k < len(ends) else float("inf")
        seen = sorted({fire_of(a) for a in runs})
        if len(seen) > 1:
            told = "; ".join(f"{fire_of(a):.3f} {a.describe()}" for a in runs)
            low = ends[k - 1] if k else float("-inf")
            flag(("mixed", low), f"occurrence ending at {high:.3f} ran fire times {seen}: {told}")
        for fire in seen:
            if fire <= last_fire:
                flag(("again", fire), f"fire time {fire:.3f} ran after {last_fire:.3f} did")
            last_fire = max(last_fire, fire)
            if k < len(ends):
                ended_at[fire] = ends[k]
    # 8c: fire times passed over, each for a reason; a move only once it could not start
    once = SCHEDULED[queue].get("catch_up", "once") == "once"
    for moved_at, old, _ in moves:
        ms = round(old * 1000)
        due = (schedule.next_after(ms) if once else ms) / 1000 + SCHEDULE_GRACE
        if moved_at < due - 0.05:
            flag(("early", old), f"moved the occurrence of {old:.3f} at {moved_at:.3f} < {due:.3f}")
    tally = {"fires": len(fires), "overlap": 0, "fault": 0, "moved": 0, "unknown_end": 0}
    if fires:
        at = round(fires[0] * 1000)
        period = (schedule.next_after(at) - at) / 1000
        known = {round(f * 1000) for f in fires}
        last = round(fires[-1] * 1000)
        while at < last:
            if at not in known:
                g = at / 1000
                before = max(f for f in fires if f < g)
                end = ended_at.get(before)
                lo, hi = g - period - SCHEDULE_GRACE - 0.5, g + SCHEDULE_GRACE + 0.5
                if end is None:
                    tally["unknown_end"] += 1
                elif end > g - CREATE_SLACK:
                    tally["overlap"] += 1
                elif any(b <= hi and e >= lo for b, e in faults):
                    tally["fault"] += 1
                elif any(old <= g < new for _, old, new in moves):
                    tally["moved"] += 1
                else:
                    flag(
                        ("lost", g),
                        f"fire time {g:.3f} never ran: the occurrence of {before:.3f} ended "
                        f"at {end:.3f}, and the server had no fault around then",
                    )
            at = schedule.next_after(at)
    # 8d: live
    times = [a.t for a in attempts if a.t >= since]
    for before, after in zip([since, *times], [*times, now], strict=True):
        down = sum(max(0.0, min(e, after) - max(b, before)) for b, e in faults)
        if after - before - down > PERIODIC_WINDOW:
            seen = [
                f"{e.outcome}@{e.ended:.3f}/{e.client}/{e.counts}"
                for e in records.events.get(key, ())
                if before - 1 <= e.ended <= after
            ]
            last = [a.describe() for a in attempts if a.t == before]
            flag(
                ("live", round(before, 3)),
                f"did not start for {after - before:.1f}s, {down:.1f}s of it with the server "
                f"faulted (from {before:.3f}: {last}; "
                f"outcomes then: {seen}; faults: {[w for w in faults if w[1] >= before - 5]})",
            )
    return tally
