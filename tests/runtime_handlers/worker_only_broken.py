"""A handler module that imports in the supervisor but not in its workers (they have
$QUEASY_REDIS_URL, set by their supervisor): like a handler that needs an environment only
the supervisor has."""

from __future__ import annotations

import os
from typing import Any

if os.environ.get("QUEASY_REDIS_URL"):
    raise ImportError("this module imports only where $QUEASY_REDIS_URL is unset")


def handle(data: Any, job: Any) -> None:
    raise AssertionError("never runs")
