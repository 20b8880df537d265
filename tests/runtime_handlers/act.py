"""A plain handler: records its start, does what the data asks (see misbehave in
tests/runtime_handlers/__init__.py), records its end."""

from __future__ import annotations

import time
from typing import Any

from tests.runtime_handlers import misbehave, record


def handle(data: dict[str, Any], job: Any) -> None:
    record("start", data, job, units=data.get("units"))
    time.sleep(misbehave(data, job))
    record("end", data, job, units=data.get("units"))
