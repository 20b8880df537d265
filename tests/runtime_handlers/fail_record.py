"""A fail handler that records the [data, job, error] it was given, and its own job."""

from __future__ import annotations

from typing import Any

from tests.runtime_handlers import record


def handle(data: Any, job: Any) -> None:
    record("fail", {}, job, given=data)
