"""An async def behind a plain decorator: `handle` is a sync function that returns a
coroutine (inspect.iscoroutinefunction(handle) is False). data["raise"]: "permanent" to fail
inside the coroutine; data["nested"]: the coroutine returns another awaitable."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from queasy_py import PermanentError
from tests.runtime_handlers import record


def logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(data: Any, job: Any) -> Any:
        return fn(data, job)

    return wrapper


async def tail(data: Any, job: Any) -> None:
    await asyncio.sleep(0.01)
    record("end", data, job, nested=True)


@logged
async def handle(data: dict[str, Any], job: Any) -> Any:
    record("start", data, job)
    await asyncio.sleep(0.05)
    if data.get("raise") == "permanent":
        raise PermanentError("failed inside the coroutine")
    if data.get("nested"):
        return tail(data, job)
    record("end", data, job)
    return None
