"""The chaos test's invariants 5 (tests/chaos/invariants.py), 8b and 8d
(tests/chaos/schedules.py) on small, known histories: the checker must flag two fire times run
in one occurrence, and must not flag a history where none was, however close an occurrence's
end and the next start are; a gap of starts counts the server's up-time only."""

from __future__ import annotations

from typing import Any

from tests.chaos.invariants import Attempt, Checker, Event, Records
from tests.chaos.schedules import check_schedule

QUEUE = "sched-skip"  # every 3 s, catch_up skip (tests/chaos/handlers SCHEDULED)


def attempt(fire: float, t: float, pid: int, took: float = 0.0003) -> Attempt:
    return Attempt(
        q=QUEUE,
        id="schedule",
        serial=f"{QUEUE}:{fire}",
        pid=pid,
        ppid=1000,
        t=t,
        run_at=fire,
        counts=(0, 0, 0),
        nb=None,
        act="complete",
        holder="1000-abc",
        leased_at=t - 0.0005,
        extra={"fire": repr(fire)},
        end=t + took,
    )


def finished(ended_ms: int, pid: int) -> Event:
    return Event("finished", ended_ms / 1000, str(pid), "1000-abc", (0, 0, 0))


def violations(
    attempts: list[Attempt], events: list[Event], faults: tuple[tuple[float, float], ...] = ()
) -> list[str]:
    records = Records()
    records.attempts[(QUEUE, "schedule")] = attempts
    records.events[(QUEUE, "schedule")] = events
    checker = Checker(records, [], [])
    since, now = attempts[0].t, attempts[-1].t + 1
    tally: dict[str, Any] = check_schedule(checker, QUEUE, None, list(faults), [], since, now)
    assert tally["fires"] == len({a.extra["fire"] for a in attempts})
    return list(checker.violations.values())


def test_a_job_acked_within_the_millisecond_it_started_ends_its_own_occurrence() -> None:
    # CI saw this: a sub-millisecond occurrence acked in the ms it began. Its end, stored
    # truncated to the ms (300.000), is before its start (300.0004); the next ran at 303.
    history = [attempt(300.0, 300.0004, pid=11), attempt(303.0, 303.0005, pid=12)]
    assert violations(history, [finished(300_000, 11), finished(303_001, 12)]) == []


def test_two_fire_times_in_one_occurrence_are_flagged() -> None:
    # the 303 occurrence started while the 300 one still ran (it ended at 300.5)
    history = [attempt(300.0, 300.0004, pid=11), attempt(303.0, 300.0006, pid=12)]
    found = violations(history, [finished(300_500, 11), finished(303_001, 12)])
    assert len(found) == 1 and "ran fire times [300.0, 303.0]" in found[0]


def test_another_worker_starting_in_the_ms_of_an_end_belongs_to_the_next_occurrence() -> None:
    # a second run of fire time 300, by another worker, begun in the ms its occurrence ended
    history = [attempt(300.0, 300.0004, pid=11), attempt(300.0, 300.0008, pid=12)]
    found = violations(history, [finished(300_000, 11), finished(300_001, 12)])
    assert any("fire time 300.000 ran after 300.000 did" in v for v in found), found


def test_the_same_worker_starting_the_next_occurrence_in_the_ms_of_an_end() -> None:
    # CI saw this once the worker ran a message's jobs in its reading thread: the occurrence
    # of 300 (run late) acked at 303.000x; the same worker began the due 303 in that same
    # ms (303.0006) and ended it after it (303.0013). The 300 occurrence's own attempts all
    # ended before its ack, so one that ends past the ms is the next occurrence's.
    history = [attempt(300.0, 302.9, pid=11), attempt(303.0, 303.0006, pid=11, took=0.0007)]
    assert violations(history, [finished(303_000, 11), finished(303_001, 11)]) == []


def test_a_queue_that_does_not_start_while_its_server_is_up_is_flagged() -> None:
    # 300 ran; 303 to 309 passed over while the occurrence of 300 ran late (8c: an overlap)
    history = [attempt(300.0, 300.0004, pid=11), attempt(312.0, 312.2, pid=12)]
    events = [finished(311_000, 11), finished(312_201, 12)]
    found = violations(history, events)
    assert len(found) == 1 and "did not start for 12.2s" in found[0], found
    # the same gap with 7.5 s of it a server fault (frozen, then refusing writes): 4.7 s up
    assert violations(history, events, ((301.0, 303.7), (303.7, 308.5))) == []


def test_a_periodic_id_that_does_not_start_while_its_server_is_up_is_flagged() -> None:
    # invariant 5: periodic-1 started at 100.0 and next at 111.5, an 11.5 s gap
    records = Records()
    records.periodic_starts["periodic-1"] = [100.0, 111.5]
    checker = Checker(records, [], [])
    checker.check_periodic(["periodic-1"], 100.0, 112.0)
    found = list(checker.violations.values())
    assert len(found) == 1 and "did not start for 11.5s, 0.0s of it" in found[0], found
    # the same gap with 2 s of it a server fault (refusing writes): 9.5 s up, not flagged;
    # a fault outside the gap leaves nothing out
    records = Records()
    records.periodic_starts["periodic-1"] = [100.0, 111.5]
    checker = Checker(records, [], [])
    checker.check_periodic(["periodic-1"], 100.0, 112.0, [(90.0, 99.0), (104.0, 106.0)])
    assert list(checker.violations.values()) == []
    checker.check_periodic(["periodic-1"], 100.0, 112.0, [(90.0, 99.0), (111.6, 113.0)])
    assert len(checker.violations) == 1
