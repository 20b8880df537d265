"""A handler that starts processes which outlive it, records their pids, then does what the
data asks (tests/runtime_handlers/__init__.py `misbehave`).

It starts a background child through a shell (`sh -c "sleep 300 &"`: the shell exits and init
adopts the sleep, which stays in the worker's process group) and, with data["setsid"], a
child in a session of its own (still the worker's child). Records "spawned" with
"background" and "session" pids. Only the first attempt of a job spawns anything.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from tests.runtime_handlers import attempt, misbehave, record


def handle(data: dict[str, Any], job: Any) -> None:
    if attempt(job) == 0:
        spawn(data, job)
    time.sleep(misbehave(data, job))
    record("end", data, job)


def spawn(data: dict[str, Any], job: Any) -> None:
    out = subprocess.run(
        ["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    pids = {"background": int(out.stdout)}
    if data.get("setsid"):
        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
        pids["session"] = child.pid
    record("spawned", data, job, **pids)
