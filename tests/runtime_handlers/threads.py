"""Handler of tests/test_worker_threads.py: sleeps the job's `sleep` seconds and returns which
thread of the worker ran it, and when (the queue stores results: the test reads them from
the worker's result messages)."""

from __future__ import annotations

import threading
import time
from typing import Any


def handle(data: dict[str, Any], job: Any) -> dict[str, Any]:
    start = time.monotonic()
    time.sleep(data.get("sleep", 0))
    return {"thread": threading.get_ident(), "start": start, "end": time.monotonic()}
