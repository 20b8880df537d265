"""A handler that returns a value (for queues that store results): data["value"], or one
JSON cannot hold when data["bad"] says which ("set", "nan", "key", "object"); it waits at
data["gate"] first (see misbehave) and records its start and end."""

from __future__ import annotations

from typing import Any

from tests.runtime_handlers import misbehave, record

BAD = {
    "set": lambda: {1, 2},
    "nan": lambda: {"x": float("nan")},
    "key": lambda: {1: "int key"},
    "object": lambda: object(),
}


def handle(data: dict[str, Any], job: Any) -> Any:
    record("start", data, job)
    misbehave(data, job)
    record("end", data, job)
    if "bad" in data:
        return BAD[data["bad"]]()
    return data.get("value")
