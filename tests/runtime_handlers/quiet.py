"""A handler that touches no Redis key of its own (for the ACL test): it only does what the
data asks (tests/runtime_handlers/__init__.py `misbehave`, without gates), and as a
fail handler just finishes."""

from __future__ import annotations

import time
from typing import Any

from tests.runtime_handlers import misbehave


def handle(data: Any, job: Any) -> None:
    if isinstance(data, dict):  # a fail job's data is [data, job, error]: it just finishes
        time.sleep(misbehave(data, job))
