"""An async def behind a plain decorator: `handle` is a sync function that returns a
coroutine (inspect.iscoroutinefunction(handle) is False). data["raise"]: "permanent" to fail
inside the coroutine; data["nested"]: the coroutine returns another awaitable;
data["barrier"]: n, the plain wrapper waits until n jobs are in it, so they all hand their
coroutines to the worker at the same moment."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from typing import Any

from queasy_py import PermanentError
from tests.runtime_handlers import record

_barriers: dict[int, threading.Barrier] = {}
_lock = threading.Lock()


def logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(data: Any, job: Any) -> Any:
        if data.get("barrier"):
            with _lock:
                barrier = _barriers.setdefault(data["barrier"], threading.Barrier(data["barrier"]))
            barrier.wait(timeout=10)
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
    record("end", data, job, loop_thread=threading.get_ident())
    return None
