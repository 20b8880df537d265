"""Which queue is dequeued next, and how many jobs: priority first, then longest unserved,
bounded by the free capacity units of the workers (nothing is prefetched).

Equal priorities take turns in shares of up to SHARE jobs, the queue asked longest ago
first: each dequeue (and the finish that follows it) carries a share, not the free slots
split as many ways as there are busy queues, while over successive rounds each queue gets
its turn.

Priority and turns hold across sizes: a ready queue that fits on no worker keeps the worker
with the most free units for itself (a reservation), so lower priorities, and the queues of
its own priority whose turn comes after its own, cannot refill it while it drains to that
queue's size.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby

from ..options import ListenOptions
from ..store.keys import QueueKeys

#: the most jobs asked of one queue in one dequeue call
MAX_BATCH = 1000
#: the most dequeues of one queue in flight at once
MAX_INFLIGHT = 2
#: the most jobs one queue takes per turn when equal priorities share the free units: a
#: round's free slots go to one queue, or a few, in shares this big, rather than one job to
#: each in turn (every call's fixed cost, the server's and the loop's, paid once per share)
SHARE = 20


@dataclass(eq=False)
class QueueState:
    """A listened queue as the scheduling loop sees it."""

    name: str
    base: str
    keys: QueueKeys
    spec: ListenOptions
    fail_base: str | None  # base key of its fail queue when it has a fail handler
    ready_at: float = 0.0  # epoch seconds when it may next have a ready job (0: now)
    last_served: float = 0.0  # monotonic time its last dequeue was sent
    inflight: int = 0  # dequeues sent whose reply has not come back yet
    woken: float = float("inf")  # earliest run_at woken for since the last dequeue was sent

    def wants(self, now: float) -> bool:
        """Ready, and not already asked: a second dequeue may be in flight only while the
        last one came back full (ready_at 0: more jobs are likely waiting)."""
        if self.ready_at > now:
            return False
        return self.inflight == 0 or (self.inflight < MAX_INFLIGHT and self.ready_at == 0.0)

    def known_ready(self, now: float) -> bool:
        """Wants, and a job is known to be ready: its last dequeue came back full (ready_at
        0, as at start and after a reconcile), or a wake-up for a job ready by now (a
        dispatch, a pushed job returned, a blocked job promoted) came since its last dequeue
        was sent. The polling fallback alone (ready_at reached) is no such evidence."""
        return self.wants(now) and (self.ready_at == 0.0 or self.woken <= now)


def next_ready(states: Iterable[QueueState], unserved: Collection[QueueState], now: float) -> float:
    """When the loop should next plan a dequeue (epoch seconds; inf: only an event brings
    one): the earliest ready time of the queues, leaving out those the last plan found
    ready but gave no units (`unserved`: a worker's result or exit wakes the loop for them)
    and those ready but held back by their own dequeues in flight (their replies wake the
    loop; waiting for their ready time, already past, would spin it)."""
    out = float("inf")
    for state in states:
        if state in unserved or (state.ready_at <= now and not state.wants(now)):
            continue
        if state.ready_at < out:
            out = state.ready_at
    return out


def place(free: list[int], size: int) -> int | None:
    """Index of the worker with the most free units that fits `size` (ties: the first), or
    None. (max() and index() in C: planned once per job of a round.)"""
    if not free:
        return None
    most = max(free)
    return free.index(most) if most >= size else None


def _most_free(free: list[int], taken: set[int]) -> int | None:
    """Index of the worker with the most free units not in `taken` (ties: the first)."""
    best = None
    for index, units in enumerate(free):
        if index not in taken and (best is None or units > free[best]):
            best = index
    return best


def plan(
    states: Sequence[QueueState], free: list[int], now: float
) -> list[tuple[QueueState, list[int]]]:
    """Which queues to dequeue, and for each the workers (indexes into `free`, one per job)
    whose units the jobs will take, given each accepting worker's free units.

    Higher priority first; equal priorities take turns, the queue asked longest ago first,
    each taking up to SHARE jobs per turn while the units last (fewer free slots than SHARE
    all go to that one queue this round; the others' turns come first in the next rounds).
    A queue known to have a ready job (`known_ready`) that is given no units reserves the
    worker with the most free units left that no higher priority reserved: lower priorities
    get no units of it, so it drains until that queue fits; so do the queues of its own
    priority whose turn comes after its own (asked more recently). A reservation yields no
    dequeue; it lasts while the evidence does.
    `free` is not modified.
    """
    free = list(free)
    ready = sorted(
        (s for s in states if s.wants(now)),
        key=lambda s: (-s.spec.priority, s.last_served),
    )
    reserved: set[int] = set()  # workers kept for a higher priority
    out: list[tuple[QueueState, list[int]]] = []
    for _, group in groupby(ready, key=lambda s: s.spec.priority):
        members = list(group)
        usable = [0 if i in reserved else units for i, units in enumerate(free)]
        slots: dict[QueueState, list[int]] = {s: [] for s in members}
        placing = members  # in turns of up to SHARE jobs each, while some still fit
        first, kept = True, set()
        while placing:
            still = []
            for state in placing:
                if first and state.known_ready(now) and place(usable, state.spec.size) is None:
                    # its turn, and it fits nowhere: the peers after it in turn get no
                    # units of the worker it drains (a big queue is not starved by a
                    # smaller one of its priority that keeps every worker full)
                    index = _most_free(free, reserved)
                    if index is not None:
                        reserved.add(index)
                        usable[index] = 0
                    kept.add(state)
                    continue
                size = state.spec.size
                got = slots[state]
                turn = min(SHARE, MAX_BATCH - len(got))
                while turn:
                    index = place(usable, size)
                    if index is None:  # usable units only shrink: it fits no more this plan
                        break
                    usable[index] -= size
                    free[index] -= size
                    got.append(index)
                    turn -= 1
                else:
                    if len(got) < MAX_BATCH:
                        still.append(state)
            placing, first = still, False
        out.extend((s, indexes) for s, indexes in slots.items() if indexes)
        for state in members:
            if not slots[state] and state not in kept and state.known_ready(now):
                index = _most_free(free, reserved)
                if index is not None:
                    reserved.add(index)
    return out
