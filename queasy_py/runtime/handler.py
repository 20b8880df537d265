"""Resolving a handler module path to its `handle(data, job)` callable."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from ..errors import HandlerError

Handle = Callable[[Any, Any], Any]


def load(path: str) -> tuple[Handle, bool]:
    """Import `path` and return (handle, is_async). HandlerError names what is wrong."""
    if (
        not isinstance(path, str)
        or not path
        or any(not part.isidentifier() for part in path.split("."))
    ):
        raise HandlerError(f"handler {path!r} is not a module path like 'myapp.handlers.email'")
    try:
        module = importlib.import_module(path)
    except Exception as exc:  # any import-time error of user code
        raise HandlerError(
            f"handler module {path!r} failed to import: {type(exc).__name__}: {exc}"
            + moved_hint(path, exc)
        ) from exc
    handle = getattr(module, "handle", None)
    if not callable(handle):
        raise HandlerError(f"handler module {path!r} has no callable handle(data, job)")
    wrong = refusal(handle)
    if wrong:
        raise HandlerError(f"handler module {path!r}: {wrong}")
    return handle, inspect.iscoroutinefunction(handle)


def refusal(handle: Any) -> str | None:
    """Why `handle` cannot be a handler, None when it can. Called, a generator function (or
    an async one) returns a generator without running its body: its jobs would finish
    without running. A class returns an instance. A signature that cannot take (data, job)
    would fail every job."""
    if inspect.isclass(handle):
        return "handle is a class (calling it makes an instance); define a function"
    code = handle.__func__ if isinstance(handle, staticmethod) else handle
    if not inspect.isroutine(code) and not isinstance(code, functools.partial):
        code = type(code).__call__.__get__(code)  # a callable object: its __call__ runs
    if inspect.isasyncgenfunction(code):
        return "handle is an async generator function: its body would never run; use async def"
    if inspect.isgeneratorfunction(code):
        return "handle is a generator function: its body would never run; drop the yield"
    inner = _unwrapped(code)  # behind decorators (functools.wraps): what they call
    if inner is not code and inspect.isasyncgenfunction(inner):
        return (
            f"handle wraps an async generator function ({_name(inner)}, through "
            "__wrapped__): its body would never run; use async def"
        )
    if inner is not code and inspect.isgeneratorfunction(inner):
        return (
            f"handle wraps a generator function ({_name(inner)}, through __wrapped__): its "
            "body would never run; drop the yield"
        )
    try:
        signature = inspect.signature(handle)
    except (TypeError, ValueError):  # a builtin without one: let it be called
        return None
    try:
        signature.bind(None, None)
    except TypeError:
        return f"handle{signature} cannot take (data, job)"
    return None


#: the most decorators (__wrapped__ links) followed from handle to the function they wrap
MAX_WRAPPED = 100


def _unwrapped(code: Any) -> Any:
    """The function `code` wraps, following __wrapped__ (functools.wraps) at most MAX_WRAPPED
    times; `code` itself when it wraps nothing (or the links loop, or are not callables)."""
    count = 0

    def stop(f: Any) -> bool:
        nonlocal count
        count += 1
        return count > MAX_WRAPPED or not callable(getattr(f, "__wrapped__", None))

    try:
        return inspect.unwrap(code, stop=stop)
    except Exception:  # noqa: BLE001 - a cycle of __wrapped__ (ValueError), a getattr raising
        return code


def _name(f: Any) -> str:
    return str(getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or repr(f))


#: the ready-made handlers, once the top-level package `handlers`, now queasy_py.handlers
READY_MADE = {"handlers.dead_letter", "handlers.reschedule"}


def moved_hint(path: str, exc: Exception) -> str:
    """Where a ready-made handler named by its old, gone name is now."""
    if path in READY_MADE and isinstance(exc, ModuleNotFoundError):
        return f" (the ready-made handlers moved: name it 'queasy_py.{path}')"
    return ""
