"""A handler stuck in C code holding the GIL (one long regex match), so no other thread of
its worker runs - not even the one that reads the pipe. Data {"gil": seconds} says how long
at least, on the job's first run. Other data: records start and end, like `act`."""

from __future__ import annotations

import re
import time
from typing import Any

from tests.runtime_handlers import record

PATTERN = re.compile(r"(a+)+$")


def match_seconds(n: int) -> float:
    began = time.perf_counter()
    PATTERN.match("a" * n + "b")
    return time.perf_counter() - began


def handle(data: dict[str, Any], job: Any) -> None:
    """Records "start" right before the long match (after a short calibration)."""
    if "gil" in data and job.timeout_count == 0:  # stuck on its first run only
        n = 16
        while (took := match_seconds(n)) < 0.05:  # each character doubles the time
            n += 1
        while took < data["gil"]:
            n += 1
            took *= 2
        record("start", data, job)
        PATTERN.match("a" * n + "b")  # one call: the GIL is not released until it returns
    else:
        record("start", data, job)
    record("end", data, job)
