"""Which queue is dequeued next, and how many jobs: priority first, then longest unserved,
bounded by the free capacity units of the workers (nothing is prefetched)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

from .options import ListenOptions

#: the most jobs asked of one queue in one dequeue call
MAX_BATCH = 1000


@dataclass(eq=False)
class QueueState:
    """A listened queue as the scheduling loop sees it."""

    name: str
    base: str
    wake: str  # its wake-up channel
    spec: ListenOptions
    fail_base: str | None  # base key of its fail queue when it has a fail handler
    ready_at: float = 0.0  # epoch seconds when it may next have a ready job (0: now)
    last_served: float = 0.0  # monotonic time of its last dequeue


def place(free: list[int], size: int) -> int | None:
    """Index of the worker with the most free units that fits `size`, or None."""
    best = None
    for index, units in enumerate(free):
        if units >= size and (best is None or units > free[best]):
            best = index
    return best


def plan(states: Sequence[QueueState], free: list[int], now: float) -> list[tuple[QueueState, int]]:
    """How many jobs to ask of each ready queue, given each accepting worker's free units.

    Higher priority first; equal priorities share the capacity round-robin, the queue served
    longest ago first. `free` is not modified.
    """
    free = list(free)
    ready = sorted(
        (s for s in states if s.ready_at <= now),
        key=lambda s: (-s.spec.priority, s.last_served),
    )
    out: list[tuple[QueueState, int]] = []
    for _, group in groupby(ready, key=lambda s: s.spec.priority):
        members = list(group)
        counts = dict.fromkeys(members, 0)
        progress = True
        while progress:
            progress = False
            for state in members:
                if counts[state] >= MAX_BATCH:
                    continue
                index = place(free, state.spec.size)
                if index is not None:
                    free[index] -= state.spec.size
                    counts[state] += 1
                    progress = True
        out.extend((s, n) for s, n in counts.items() if n > 0)
    return out
