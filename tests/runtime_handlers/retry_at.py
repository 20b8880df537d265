"""A handler that raises RetryLater with the retry_at its data describes, on the first
attempt only; later attempts record "end".

data["at"]: ["float", "inf" | "1e300" | ...] (float(text)), ["decimal", text]
(decimal.Decimal(text)), ["stamp", text] (an object whose timestamp() returns
decimal.Decimal(text), which orjson cannot encode), ["now+", seconds] (time.time() + seconds),
["datetime", iso text] (an aware datetime), ["raw", value] (the JSON value as it is).
"""

from __future__ import annotations

import datetime
import decimal
import time
from typing import Any

from queasy_py import RetryLater
from tests.runtime_handlers import attempt, record


class Stamp:
    """A datetime-like value whose timestamp() is not a float."""

    def __init__(self, text: str) -> None:
        self.text = text

    def timestamp(self) -> decimal.Decimal:
        return decimal.Decimal(self.text)


def retry_at(spec: list[Any]) -> Any:
    kind, value = spec
    if kind == "float":
        return float(value)
    if kind == "decimal":
        return decimal.Decimal(value)
    if kind == "stamp":
        return Stamp(value)
    if kind == "now+":
        return time.time() + value
    if kind == "datetime":
        return datetime.datetime.fromisoformat(value)
    return value


def handle(data: dict[str, Any], job: Any) -> None:
    record("start", data, job)
    if attempt(job) == 0:
        raise RetryLater("later", retry_at=retry_at(data["at"]))
    record("end", data, job)
