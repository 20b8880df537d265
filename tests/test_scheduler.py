"""plan() alone (a pure function): which queues are dequeued, and on which workers' units;
and next_ready(): when the loop plans again.

Priority holds across sizes: a queue known to have a ready job that fits on no worker
reserves the worker with the most free units, which lower priorities may not refill.
"""

from __future__ import annotations

import pytest

from queasy_py.options import ListenOptions
from queasy_py.runtime.scheduler import (
    MAX_BATCH,
    MAX_INFLIGHT,
    SHARE,
    QueueState,
    next_ready,
    plan,
)
from queasy_py.store.keys import QueueKeys

NOW = 1_000_000.0
POLLED = NOW - 0.5  # ready_at reached through the polling fallback: no evidence of a job


def state(
    name: str,
    size: int = 10,
    priority: int = 100,
    ready_at: float = 0.0,
    woken: float = float("inf"),
    inflight: int = 0,
    last_served: float = 0.0,
) -> QueueState:
    """A listened queue; by default its last dequeue came back full (ready_at 0)."""
    spec = ListenOptions.build(name, "x", {"size": size, "priority": priority}, check=False)
    return QueueState(
        name,
        f"q:{name}",
        QueueKeys("q", name, name),
        spec,
        None,
        ready_at=ready_at,
        last_served=last_served,
        inflight=inflight,
        woken=woken,
    )


def asks(states: list[QueueState], free: list[int]) -> dict[str, list[int]]:
    """{queue: sorted indexes of the workers its jobs will take units of}."""
    return {s.name: sorted(slots) for s, slots in plan(states, free, NOW)}


# ---------------------------------------------------------------- evidence of a ready job


def test_known_ready_needs_a_full_last_dequeue_or_a_wake_up_for_a_job_ready_by_now() -> None:
    assert state("full").known_ready(NOW)  # ready_at 0: its last dequeue came back full
    assert state("woken", ready_at=POLLED, woken=NOW - 1).known_ready(NOW)
    assert not state("polled", ready_at=POLLED).known_ready(NOW)
    assert not state("woken later", ready_at=POLLED, woken=NOW + 1).known_ready(NOW)
    assert not state("not yet", ready_at=NOW + 1, woken=NOW + 1).known_ready(NOW)
    assert not state("asked twice", inflight=2).known_ready(NOW)  # wants() is false


# ---------------------------------------------------------------- as before: no contention


def test_higher_priority_first_then_the_rest_of_the_units() -> None:
    states = [state("low", priority=1), state("high", size=30, priority=2)]
    assert asks(states, [100]) == {"high": [0, 0, 0], "low": [0]}


def test_equal_priorities_take_turns_the_queue_asked_longest_ago_first() -> None:
    states = [state("a", last_served=2.0), state("b", last_served=1.0)]
    # fewer free slots than a share: all of them to the queue asked longest ago
    assert asks(states, [30]) == {"b": [0, 0, 0]}
    # more: shares of SHARE jobs in turn, while the units last
    small = [state("a", size=1, last_served=2.0), state("b", size=1, last_served=1.0)]
    assert asks(small, [2 * SHARE + 5]) == {"b": [0] * (SHARE + 5), "a": [0] * SHARE}


def test_busy_equal_priorities_get_equal_turns_and_each_dequeue_carries_the_free_slots() -> None:
    """Four busy queues, rounds of 10 free slots, each asked queue's last_served set when
    its dequeue is sent (as the loop does): one queue per round takes all 10, and over four
    rounds each queue has had its turn. Split one job each in turn, every dequeue (and the
    finish after it) carried 2-3 jobs, and paid its fixed cost 4 times per 10 jobs."""
    queues = [state(name) for name in "abcd"]
    served: list[tuple[str, int]] = []
    for t in range(8):
        for s, slots in plan(queues, [50, 50], NOW):
            s.last_served = NOW + t
            served.append((s.name, len(slots)))
    assert served == [(name, 10) for name in "abcdabcd"]


def test_jobs_go_to_the_worker_with_the_most_free_units_and_free_is_not_modified() -> None:
    free = [20, 50, 0]
    ((_, slots),) = plan([state("q", size=20)], free, NOW)
    assert slots == [1, 1, 0]  # 50 -> 30 -> 20 free on worker 1, then the tie: the first
    assert free == [20, 50, 0]


def test_a_batch_is_bounded() -> None:
    assert len(asks([state("q", size=1)], [100] * 20)["q"]) == MAX_BATCH


def test_a_queue_that_does_not_want_is_not_asked() -> None:
    states = [state("later", ready_at=NOW + 1), state("busy", inflight=1, ready_at=POLLED)]
    assert asks(states, [100]) == {}


# ---------------------------------------------------------------- reservations


def test_a_big_queue_that_fits_nowhere_reserves_the_worker_lower_priorities_would_refill() -> None:
    states = [state("big", size=100, priority=200), state("small", priority=100)]
    assert asks(states, [50]) == {}  # nothing refills the worker: it drains
    assert asks(states, [100]) == {"big": [0]}  # drained: the big queue is dequeued


def test_a_reservation_keeps_one_worker_the_others_stay_with_lower_priorities() -> None:
    states = [state("big", size=100, priority=200), state("small", priority=100)]
    # the worker with the most free units is the one kept; ties: the first
    assert asks(states, [30, 60, 20]) == {"small": [0, 0, 0, 2, 2]}
    assert asks(states, [40, 40]) == {"small": [1, 1, 1, 1]}


def test_a_ready_queue_found_by_a_wake_up_reserves_too() -> None:
    states = [state("big", 100, 200, ready_at=NOW - 1, woken=NOW - 1), state("small")]
    assert asks(states, [50]) == {}


def test_a_queue_not_known_to_have_a_job_reserves_nothing() -> None:
    # an empty big queue polled every poll_interval must not drain a worker each time
    polled = state("big", size=100, priority=200, ready_at=POLLED)
    assert asks([polled, state("small")], [50]) == {"small": [0] * 5}
    delayed = state("big", size=100, priority=200, ready_at=POLLED, woken=NOW + 5)
    assert asks([delayed, state("small")], [50]) == {"small": [0] * 5}


def test_a_queue_given_units_this_round_reserves_nothing_more() -> None:
    states = [state("mid", size=50, priority=200), state("small", priority=100)]
    # mid takes 50 of worker 0 and fits nowhere then, but its dequeue is on its way
    assert asks(states, [60, 30]) == {"mid": [0], "small": [0, 1, 1, 1]}


def test_big_queues_at_several_priorities_each_reserve_their_own_worker() -> None:
    states = [
        state("top", size=100, priority=300),
        state("mid", size=100, priority=200),
        state("small", priority=100),
    ]
    # top keeps the worker with the most free units, mid the best of the others
    assert asks(states, [40, 60, 20]) == {"small": [2, 2]}
    # one worker: top keeps it; mid reserves nothing else and gets nothing
    assert asks(states, [50]) == {}
    assert asks(states, [100]) == {"top": [0]}


def test_a_reserved_worker_is_not_used_by_a_lower_priority_that_fits_on_it() -> None:
    states = [
        state("big", size=100, priority=300),
        state("mid", size=40, priority=200),
        state("small", priority=100),
    ]
    # big keeps worker 0 (60 free); mid fits there but may not take it: it keeps worker 1
    assert asks(states, [60, 30, 20]) == {"small": [2, 2]}


def test_a_big_queue_is_not_starved_by_a_smaller_one_of_its_priority() -> None:
    # its turn (asked longest ago) and it fits nowhere: the smaller queue after it in turn
    # does not refill the worker it drains; then it takes the drained worker
    states = [state("big", size=100, last_served=1.0), state("small", last_served=2.0)]
    assert asks(states, [50]) == {}
    assert asks(states, [100]) == {"big": [0]}
    # the smaller one's turn first: it takes its share, the big one keeps what is left
    states = [state("big", size=100, last_served=2.0), state("small", last_served=1.0)]
    assert asks(states, [50]) == {"small": [0] * 5}
    # the other workers stay open to its peers; lower priorities get nothing of the kept one
    states = [state("big", 100, 200), state("peer", 10, 200), state("low", 10, 100)]
    assert asks(states, [50, 30]) == {"peer": [1, 1, 1]}


@pytest.mark.parametrize("size", [1, 37, 100])
def test_every_size_fits_a_drained_worker(size: int) -> None:
    states = [state("big", size=size, priority=200), state("small", size=1, priority=100)]
    assert asks(states, [size - 1]) == {}
    assert asks(states, [size]) == {"big": [0]}


# ---------------------------------------------------------------- when the loop plans again


def test_next_ready_is_the_earliest_ready_time_of_the_queues() -> None:
    queues = [state("later", ready_at=NOW + 5), state("sooner", ready_at=NOW + 1)]
    assert next_ready(queues, set(), NOW) == NOW + 1
    assert next_ready([], set(), NOW) == float("inf")


def test_a_queue_held_back_by_its_dequeues_in_flight_is_not_waited_for() -> None:
    """Its replies wake the loop. Its ready time is past, so waiting for it was a select(0):
    the loop spun while the dequeues were on their way (every round with several busy
    queues, or with a worker's results coming back a few at a time)."""
    full = state("full, asked twice", inflight=MAX_INFLIGHT)  # ready_at 0: its last came full
    short = state("polled, asked", ready_at=POLLED, inflight=1)
    assert not full.wants(NOW) and not short.wants(NOW)
    assert next_ready([full, short], set(), NOW) == float("inf")
    assert next_ready([full, short, state("later", ready_at=NOW + 2)], set(), NOW) == NOW + 2


def test_a_ready_queue_the_last_plan_gave_no_units_waits_for_a_worker() -> None:
    ready = state("ready")
    assert next_ready([ready], set(), NOW) == 0.0  # plan it now
    assert next_ready([ready], {ready}, NOW) == float("inf")
