"""Handler of scheduled queues (tests/test_schedule_runtime.py): records each run of an
occurrence with its fire time, then does what `<prefix>:mode:<queue>` says when it starts
("ok" or unset: finish; "fail": raise ValueError; "sleep:<s>": sleep, then finish; "gate":
block until the test opens gate <queue>)."""

from __future__ import annotations

import time
from typing import Any

from tests.runtime_handlers import conn, key, record


def handle(data: dict[str, Any], job: Any) -> None:
    mode = conn().get(key(f"mode:{job.queue}")) or "ok"
    record("start", data, job, fire_at=data["fire_at"], mode=mode)
    if mode == "fail":
        record("end", data, job, fire_at=data["fire_at"], mode=mode)
        raise ValueError(f"scheduled run of {data['fire_at']} fails")
    if mode.startswith("sleep:"):
        time.sleep(float(mode[6:]))
    elif mode == "gate" and conn().blpop([key(f"gate:{job.queue}")], timeout=60) is None:
        raise RuntimeError("gate never opened")
    record("end", data, job, fire_at=data["fire_at"], mode=mode)
