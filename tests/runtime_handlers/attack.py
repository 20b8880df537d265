"""Handlers of tests/test_worker_attack.py: a sync handler whose data says what to do
(sleep, spin on the CPU holding the GIL, raise, return something odd, return a coroutine),
and an async one. Every run returns which thread ran it, and when."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class _Str(str):
    pass


def _ran(start: float) -> dict[str, Any]:
    return {"thread": threading.get_ident(), "start": start, "end": time.monotonic()}


def handle(data: dict[str, Any], job: Any) -> Any:
    start = time.monotonic()
    if "sleep" in data:
        time.sleep(data["sleep"])
    if "spin" in data:  # CPU-bound pure Python: holds the GIL but for the switch interval
        until = time.monotonic() + data["spin"]
        while time.monotonic() < until:
            pass
    if "raise" in data:
        raise {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}[data["raise"]](
            "bye"
        )
    if data.get("unencodable"):
        return {"x": object()}
    if data.get("bad_key"):  # a non-str key whose repr fails
        return {_BadRepr(): 1}
    if data.get("bad_str"):  # a str subclass: not a str to the check
        return {"x": _Str("y")}
    if "coro" in data:  # a sync wrapper returning a coroutine

        async def later() -> dict[str, Any]:
            await asyncio.sleep(data["coro"])
            return _ran(start)

        return later()
    return _ran(start)


async def handle_async(data: dict[str, Any], job: Any) -> dict[str, Any]:
    start = time.monotonic()
    await asyncio.sleep(data.get("sleep", 0))
    return _ran(start)
