"""The garbage collector while the supervisor's loop runs.

Every job makes a few short-lived containers in the loop (its `Running`, its ack, the lists
of a round). With CPython's gen-0 threshold of 700 a young collection ran every 30-40 jobs,
promoting the jobs then in flight into the older generations, whose collections walked
every object of the process (its imports included: a full collection of 17 ms under load).
While the loop runs, what start-up made is frozen (gc.freeze: no collection walks it) and
young collections run every LOOP_GEN0 allocations; both are undone when the loop ends. A
process that froze objects itself keeps its own freeze and thresholds.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: gen-0 threshold while the loop runs (CPython's default: 700)
LOOP_GEN0 = 20_000


@contextmanager
def loop_collector() -> Iterator[None]:
    """Freeze what exists and raise the gen-0 threshold until the block ends."""
    if gc.get_freeze_count() or not gc.isenabled():  # the process manages its collector
        yield
        return
    saved = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(saved[0], LOOP_GEN0), *saved[1:])
    try:
        yield
    finally:
        gc.set_threshold(*saved)
        gc.unfreeze()  # frozen objects that died since can be collected again
