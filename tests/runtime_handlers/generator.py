"""A handler whose handle is a generator function: calling it runs nothing (refused at load)."""

from typing import Any

from tests.runtime_handlers import record


def handle(data: Any, job: Any) -> Any:
    record("start", data, job)
    yield None
