"""Which queue is dequeued next, and how many jobs: priority first, then longest unserved,
bounded by the free capacity units of the workers (nothing is prefetched)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

from ..options import ListenOptions
from ..store.keys import QueueKeys

#: the most jobs asked of one queue in one dequeue call
MAX_BATCH = 1000
#: the most dequeues of one queue in flight at once
MAX_INFLIGHT = 2


@dataclass(eq=False)
class QueueState:
    """A listened queue as the scheduling loop sees it."""

    name: str
    base: str
    keys: QueueKeys
    spec: ListenOptions
    fail_base: str | None  # base key of its fail queue when it has a fail handler
    ready_at: float = 0.0  # epoch seconds when it may next have a ready job (0: now)
    last_served: float = 0.0  # monotonic time of its last dequeue
    inflight: int = 0  # dequeues sent whose reply has not come back yet
    woken: float = float("inf")  # earliest run_at woken for since the last dequeue was sent

    def wants(self, now: float) -> bool:
        """Ready, and not already asked: a second dequeue may be in flight only while the
        last one came back full (ready_at 0: more jobs are likely waiting)."""
        if self.ready_at > now:
            return False
        return self.inflight == 0 or (self.inflight < MAX_INFLIGHT and self.ready_at == 0.0)


def place(free: list[int], size: int) -> int | None:
    """Index of the worker with the most free units that fits `size`, or None."""
    best = None
    for index, units in enumerate(free):
        if units >= size and (best is None or units > free[best]):
            best = index
    return best


def plan(
    states: Sequence[QueueState], free: list[int], now: float
) -> list[tuple[QueueState, list[int]]]:
    """Which queues to dequeue, and for each the workers (indexes into `free`, one per job)
    whose units the jobs will take, given each accepting worker's free units.

    Higher priority first; equal priorities share the capacity round-robin, the queue served
    longest ago first. `free` is not modified.
    """
    free = list(free)
    ready = sorted(
        (s for s in states if s.wants(now)),
        key=lambda s: (-s.spec.priority, s.last_served),
    )
    out: list[tuple[QueueState, list[int]]] = []
    for _, group in groupby(ready, key=lambda s: s.spec.priority):
        members = list(group)
        slots: dict[QueueState, list[int]] = {s: [] for s in members}
        progress = True
        while progress:
            progress = False
            for state in members:
                if len(slots[state]) >= MAX_BATCH:
                    continue
                index = place(free, state.spec.size)
                if index is not None:
                    free[index] -= state.spec.size
                    slots[state].append(index)
                    progress = True
        out.extend((s, indexes) for s, indexes in slots.items() if indexes)
    return out
