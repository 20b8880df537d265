"""Schedules: a queue's cron expression (or interval) and the check that keeps its one
occurrence going (lua/queasy.lua queasy_schedule).

Fire times are a grid: a cron expression's matches in its timezone, or the multiples of
`schedule_every` since the epoch, so every supervisor computes the same ones and the next fire
time comes from the last one (no drift). A supervisor asks the library, in its rounds, to create
the occurrence for the next fire time once the last one ended (right after its own finish or
fail of it, and every `poll_interval` as the safety net for everything else); the library
creates it only if there is none and its fire time is later than the last (a compare-and-set
on B:schedule's fire_at), so supervisors never create one twice. Times here are the server's
(ms), read through the heartbeat's clock offset.
"""

from __future__ import annotations

import logging
import time
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import redis

from .. import defaults
from ..errors import InvalidInput
from ..store import fields
from ..store.upgrading import read_converting
from .outage import transient

if TYPE_CHECKING:
    from ..options import ListenOptions
    from .heartbeat import ServerClock
    from .outcomes import Ack
    from .scheduler import QueueState

log = logging.getLogger("queasy_py")

#: fire times counted at most when catch-up passes over them (the count is shown by status)
COUNT_LIMIT = 10_000
#: the longest text of a schedule, in UTF-8 bytes (the library's MAX_SPEC)
MAX_TEXT = 200
#: codes of queasy_schedule
NOTHING, STALE, CREATED, MOVED = 0, 1, 2, 3
GRACE_MS = int(defaults.SCHEDULE_GRACE * 1000)


class Schedule:
    """The fire times of a cron expression in a timezone, or of an interval (ms)."""

    def __init__(self, cron: str | None, every_ms: int | None, timezone: str) -> None:
        self.cron = cron
        self.every_ms = every_ms
        self.timezone = timezone
        self.zone = zoneinfo.ZoneInfo(timezone)
        #: count(): low -> (high, fire times in [low, high)) of its last count from low
        self._counted: dict[int, tuple[int, int]] = {}
        if cron is not None:
            self.text = f"cron {cron} {timezone}"
        else:
            assert every_ms is not None
            seconds = f"{every_ms // 1000}.{every_ms % 1000:03d}".rstrip("0").rstrip(".")
            self.text = f"every {seconds}s"

    def spelled_by(self, text: str) -> bool:
        """Whether a stored text is this schedule: ours, or the same cron expression in our
        timezone spelled another way (queasy_py before 4.3.0 stored it as written)."""
        if text == self.text:
            return True
        if self.cron is None or not text.startswith("cron "):
            return False
        from .crontext import canonical_or_none

        expression, _, zone = text[5:].rpartition(" ")
        return zone == self.timezone and canonical_or_none(expression) == self.cron

    def _sim(self, ms: int, reverse: bool = False) -> Any:
        from cronsim import CronSim  # lazily: `import queasy_py` stays light

        at = datetime.fromtimestamp(ms // 1000, UTC) + timedelta(milliseconds=ms % 1000)
        if reverse:
            at += timedelta(microseconds=1)  # CronSim(reverse) yields times before `at`
        # the local time from UTC: its fold tells the two passes of a fall-back's repeated hour
        # apart (arithmetic on a local datetime would drop it)
        return CronSim(self.cron, at.astimezone(self.zone), reverse=reverse)  # type: ignore[arg-type]

    def next_after(self, ms: int) -> int:
        """The first fire time later than `ms`."""
        if self.every_ms is not None:
            return (ms // self.every_ms + 1) * self.every_ms
        # started in the second pass of a repeated hour (fold=1), CronSim may yield a time of
        # the first pass, before the start: skip those
        return next(t for t in self._stamps(ms, False) if t > ms)

    def latest(self, ms: int) -> int:
        """The last fire time at or before `ms`."""
        if self.every_ms is not None:
            return ms // self.every_ms * self.every_ms
        # CronSim(reverse) compares wall times, so from the second pass of a repeated hour it
        # passes over that hour's first-pass fire times: walk forward from what it found
        found = next(t for t in self._stamps(ms, True) if t <= ms)
        while (after := self.next_after(found)) <= ms:
            found = after
        return found

    def _stamps(self, ms: int, reverse: bool) -> Any:
        return (int(at.timestamp() * 1000) for at in self._sim(ms, reverse))

    def count(self, low: int, high: int) -> int:
        """How many fire times lie in [low, high) (at most COUNT_LIMIT)."""
        if high <= low:
            return 0
        if self.every_ms is not None:
            first = -(-low // self.every_ms)  # ceil
            return max(0, min(COUNT_LIMIT, -(-high // self.every_ms) - first))
        # a check repeats its count every poll_interval with a later `high` (an occurrence
        # that runs past many fire times): go on from the last count from `low`, so each
        # check walks the fire times since the last, not all since `low` (at COUNT_LIMIT none)
        start, n = low, 0
        known = self._counted.get(low)
        if known is not None and low < known[0] <= high:
            start, n = known
        at = self.latest(start)
        at = at if at == start else self.next_after(start)
        while at < high and n < COUNT_LIMIT:
            n += 1
            at = self.next_after(at)
        if low not in self._counted and len(self._counted) >= 4:  # a plan counts from 2 lows
            self._counted.clear()
        self._counted[low] = (high, n)
        return n


def build(queue: str, spec: ListenOptions) -> Schedule | None:
    """The schedule of listen() options; InvalidInput names the queue and what is wrong."""
    cron, every = spec.schedule, spec.schedule_every
    if cron is None and every is None:
        return None
    if spec.timezone == "localtime":  # zoneinfo finds it (a link to /etc/localtime): it is
        # each host's own zone, so supervisors on two hosts would compute two grids
        raise InvalidInput(
            f"queue {queue!r}: timezone 'localtime' is the host's zone, which may differ "
            "between supervisors: give an IANA name (such as 'Europe/Paris')"
        )
    try:
        zoneinfo.ZoneInfo(spec.timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder of
        # zones ("Europe") or a name too long for a file
        raise InvalidInput(
            f"queue {queue!r}: timezone {spec.timezone!r} is not a known IANA time zone"
        ) from None
    if every is not None:
        return Schedule(None, max(1, round(every * 1000)), spec.timezone)
    from cronsim import CronSimError

    assert cron is not None
    from .crontext import canonical

    try:
        # one text per schedule (`MON-FRI`, `mon-fri`, `1-5`): the library compares texts
        written = " ".join(cron.split())
        schedule = Schedule(canonical(written), None, spec.timezone)
        if len(schedule.text.encode()) > MAX_TEXT:  # runs written out (`0/3,1/3`): kept as written
            schedule = Schedule(written, None, spec.timezone)
        schedule.next_after(int(time.time() * 1000))
    except CronSimError as exc:
        raise InvalidInput(
            f"queue {queue!r}: schedule {cron!r} is not a cron expression of 5 fields (or 6 "
            f"with seconds first): {exc}"
        ) from None
    except StopIteration:
        raise InvalidInput(
            f"queue {queue!r}: schedule {cron!r} never fires (no match within 50 years)"
        ) from None
    if len(schedule.text.encode()) > MAX_TEXT:  # bytes, as the library counts
        raise InvalidInput(f"queue {queue!r}: schedule {cron!r} is too long")
    return schedule


@dataclass
class Seen:
    """B:schedule as the last reply said: the current occurrence's fire time, the schedule's
    text, the fire time of the last occurrence that ended, and the occurrence's state."""

    fire_at: int | None = None
    spec: str = ""
    last_fire_at: int | None = None
    state: str = ""


class ScheduleCheck:
    """One listened queue's schedule, as this supervisor keeps it going."""

    def __init__(self, state: QueueState, schedule: Schedule, interval: float) -> None:
        self.state = state
        self.schedule = schedule
        self.once = state.spec.catch_up == "once"
        self.interval = interval
        self.seen = Seen()
        self.due = 0.0  # monotonic time of the next check (0: now)
        self.inflight = False
        self.failing = False  # its last check failed on its own (logged once until it works)

    def text(self) -> str:
        """The text to send: the stored one where it spells this schedule another way (written
        by a queasy_py before 4.3.0, which compares texts: sent ours, it takes ours for a
        changed schedule and moves a late occurrence), else ours (canonical)."""
        spec = self.seen.spec
        return spec if spec and self.schedule.spelled_by(spec) else self.schedule.text

    def plan(self, now: int) -> tuple[int, int | None, int, int]:
        """(create_at, retime_at, skipped if created, skipped if moved) at server time `now`."""
        s, seen, text = self.schedule, self.seen, self.text()
        if seen.fire_at is None:
            return s.next_after(now), None, 0, 0
        at = s.next_after(seen.fire_at)
        create, skipped = at, 0
        if at < now - GRACE_MS:  # missed: the last occurrence ended late, or nothing ran
            create = s.latest(now) if self.once else s.next_after(now)
            skipped = s.count(at, create)
        retime, moved = None, 0
        if seen.state != "waiting":  # only a pending one may move (the library checks too)
            pass
        elif seen.spec != text:  # the schedule changed: the pending occurrence follows it
            retime = s.next_after(max(now, seen.last_fire_at or 0))
        elif self.once and at < now - GRACE_MS:  # a second fire time passed: run once, now
            retime = s.latest(now)
        elif not self.once and seen.fire_at < now - GRACE_MS:
            retime = s.next_after(now)
        if retime is not None:
            if retime == seen.fire_at:
                retime = None
            elif seen.spec == text:
                moved = s.count(seen.fire_at, retime)
        return create, retime, skipped, moved

    def command(self, now: int) -> tuple:
        create, retime, skipped, moved = self.plan(now)
        seen = "" if self.seen.fire_at is None else self.seen.fire_at
        args = (self.text(), seen, create, "" if retime is None else retime)
        return ("FCALL", "queasy_schedule", 1, self.state.base, "", *args, skipped, moved)

    def on_reply(self, reply: list, clock: ServerClock) -> None:
        code, fire_at, spec, last, state = reply
        before, code = self.seen, int(code)
        self.seen = Seen(
            int(fire_at) if fire_at else None,
            spec.decode() if isinstance(spec, bytes) else str(spec),
            int(last) if last else None,
            state.decode() if isinstance(state, bytes) else str(state),
        )
        if code == STALE:  # another supervisor moved it on: compute again, now
            self.due = 0.0
        if code not in (CREATED, MOVED) or self.seen.fire_at is None:
            return
        self.state.ready_at = min(self.state.ready_at, clock.local(self.seen.fire_at))
        name, at = self.state.name, self.iso(self.seen.fire_at)
        if code == MOVED and not self.schedule.spelled_by(before.spec):
            text = self.schedule.text
            log.info("schedule of %s is now %r: next occurrence at %s", name, text, at)
        elif code == MOVED:
            log.warning(
                "schedule of %s: the occurrence of %s could not start in time; catch_up=%s "
                "moved it to %s",
                name,
                self.iso(before.fire_at or 0),
                self.state.spec.catch_up,
                at,
            )
        elif before.fire_at is not None and self.schedule.next_after(before.fire_at) < (
            self.seen.fire_at
        ):
            log.warning(
                "schedule of %s: fire times after %s were missed (the last occurrence ended "
                "late); catch_up=%s: next occurrence at %s",
                name,
                self.iso(before.fire_at),
                self.state.spec.catch_up,
                at,
            )
        else:
            log.debug("schedule of %s: next occurrence at %s", name, at)

    def iso(self, ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, self.schedule.zone).isoformat()


class Schedules:
    """The schedule checks of a supervisor's queues, sent in its rounds (runtime/rounds.py)."""

    def __init__(self, states: list[QueueState], interval: float, clock: ServerClock) -> None:
        self.interval = interval
        self.clock = clock
        self.checks: dict[str, ScheduleCheck] = {}
        for state in states:
            schedule = build(state.name, state.spec)
            if schedule is not None:
                self.checks[state.base] = ScheduleCheck(state, schedule, interval)

    def seed(self, r: redis.Redis) -> None:
        """Read every schedule once before the first round, so that round's checks compute
        from what is stored: a pending occurrence missed while everything was down is moved
        (catch-up) before the round's own dequeue could take it. Bounded by `r`'s timeout;
        on an error the first checks are stale and answered with what is stored."""
        for check in self.checks.values():
            row = read_converting(r, "queasy_schedule_info", check.state.base, "")
            if row is not None:
                spec, fire_at, state, last = (fields.text(v) for v in row[:4])
                check.seen = Seen(
                    int(fire_at) if fire_at else None,
                    spec,
                    int(last) if last else None,
                    "waiting" if state == "delayed" else state,
                )

    def next_due(self) -> float:
        """Monotonic time of the next check (inf without schedules)."""
        if not self.checks:  # most supervisors: no schedule (this runs at every loop step)
            return float("inf")
        return min((c.due for c in self.checks.values() if not c.inflight), default=float("inf"))

    def take(self, acks: list[Ack], stopping: bool) -> list[ScheduleCheck]:
        """The checks to send in this round: those due (not while stopping), and those of a
        queue whose occurrence this round finishes or fails (its next is created right after,
        in the same pipeline)."""
        if not self.checks:  # no schedule: no pass over the round's acks
            return []
        mono = time.monotonic()
        ended = {a.base for a in acks if a.op != "retry" and a.args[0] == defaults.SCHEDULE_ID}
        out = []
        for base, check in self.checks.items():
            if check.inflight:
                continue
            if base in ended or (not stopping and mono >= check.due):
                check.inflight = True
                check.due = mono + self.interval
                out.append(check)
        return out

    def commands(self, checks: list[ScheduleCheck]) -> list[tuple]:
        if not checks:  # most rounds: no clock read
            return []
        now = self.clock.server_ms(time.time())
        return [check.command(now) for check in checks]

    def failed(self, checks: list[ScheduleCheck]) -> None:
        """The round was not sent or its reply was lost: check again at the next round."""
        for check in checks:
            check.inflight = False
            check.due = 0.0

    def on_replies(self, checks: list[ScheduleCheck], replies: list) -> BaseException | None:
        """Take the replies; a transient error (an outage) is returned, others are logged."""
        refused = None
        for check, reply in zip(checks, replies, strict=True):
            check.inflight = False
            if isinstance(reply, redis.ResponseError):
                if transient(reply):
                    refused, check.due = reply, 0.0
                else:  # learn what is stored again before the next
                    if not check.failing:  # once until it works again, not once a check
                        log.error("schedule check of %s failed: %s", check.state.name, reply)
                    check.failing = True
                    check.seen = Seen()
                continue
            if check.failing:
                check.failing = False
                log.warning("schedule check of %s works again", check.state.name)
            try:
                check.on_reply(reply, self.clock)
            except (ValueError, TypeError, AttributeError):
                log.error("schedule check of %s: malformed reply %r", check.state.name, reply)
        return refused
