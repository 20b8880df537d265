"""A handler that misbehaves in the ways of the bad-input table (tests/test_bad_input_runtime.py).

data["do"]: "return_object" (a non-JSON return value), "raise" (data["error"] names an
exception that is hard to encode), "print_mb" (data["mb"] megabytes to stdout),
"close_std" (closes stdin and stdout, the objects and the file descriptors), "setsid"
(tries to move the worker into a new session: a worker already leads its own session, so
os.setsid() fails with EPERM, which the handler records as "setsid_refused"),
"close_stderr" (closes the sys.stderr object, as a library that tidies up the streams does,
and returns a value JSON cannot hold: the worker's logging then writes to a closed file).
Anything else: just finish. Records start and end. `handle_async` is the same on the worker's
event loop, after data["sleep"] seconds.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from tests.runtime_handlers import record


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ of this exception fails")


class ExitingStr(Exception):
    """Its __str__ raises SystemExit: a BaseException, not an Exception."""

    def __str__(self) -> str:
        raise SystemExit("__str__ of this exception exits")


class InterruptingKind(Exception):
    @property
    def kind(self) -> str:
        raise KeyboardInterrupt


class KindlessError(Exception):
    @property
    def kind(self) -> str:
        raise RuntimeError("reading .kind of this exception fails")


def make_error(name: str) -> BaseException:
    if name == "unprintable":
        return Unprintable("never shown")
    if name == "non_json_args":
        return ValueError(object(), {1, 2}, b"\xff\xfe")
    if name == "surrogate":
        return ValueError("undecodable file name b\udcffd.txt")
    if name == "exiting_str":
        return ExitingStr("never shown")
    if name == "interrupting_kind":
        return InterruptingKind("kind raises KeyboardInterrupt")
    if name == "bad_kind":
        return KindlessError("kind is a property that raises")
    if name == "huge_message":
        return ValueError("m" * 10_000_000)
    raise AssertionError(name)


def handle(data: dict[str, Any], job: Any) -> Any:
    record("start", data, job)
    action = data.get("do")
    if action == "return_object":
        record("end", data, job)
        return {"when": object()}
    if action == "raise":
        raise make_error(data["error"])
    if action == "print_mb":
        chunk = "x" * 1023 + "\n"
        for _ in range(data["mb"] * 1024):
            sys.stdout.write(chunk)
        sys.stdout.flush()
    elif action == "close_std":
        sys.stdout.flush()
        sys.stdin.close()
        sys.stdout.close()
        os.close(0)
        os.close(1)
    elif action == "close_stderr":
        sys.stderr.close()
        record("end", data, job)
        return {"when": object()}
    elif action == "setsid":
        try:
            os.setsid()
        except PermissionError:
            record("setsid_refused", data, job)
    record("end", data, job)
    return None


async def _exit() -> None:
    sys.exit("a background task exits")


async def handle_async(data: dict[str, Any], job: Any) -> Any:
    """Also "exit_in_task" (a task left running that raises SystemExit: asyncio lets it out
    of the event loop) and "stop_loop" (stops the worker's event loop)."""
    await asyncio.sleep(data.get("sleep", 0))
    if data.get("do") == "exit_in_task":
        _tasks.add(asyncio.get_running_loop().create_task(_exit()))
    elif data.get("do") == "stop_loop":
        asyncio.get_running_loop().stop()
    return handle(data, job)


_tasks: set[Any] = set()  # the tasks of exit_in_task, kept from the collector
