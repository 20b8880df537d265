"""A handler whose handle cannot be called as handle(data, job) (refused at load)."""

from typing import Any

from tests.runtime_handlers import record


def handle(data: Any) -> None:
    record("start", data, None)
