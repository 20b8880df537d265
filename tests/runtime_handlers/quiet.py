"""A handler that touches no Redis key of its own (for the ACL test): it only does what the
data asks (tests/runtime_handlers/__init__.py `misbehave`, without gates)."""

from __future__ import annotations

import time
from typing import Any

from tests.runtime_handlers import misbehave


def handle(data: dict[str, Any], job: Any) -> None:
    time.sleep(misbehave(data, job))
