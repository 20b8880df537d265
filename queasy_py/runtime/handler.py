"""Resolving a handler module path to its `handle(data, job)` callable."""

from __future__ import annotations

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
    return handle, inspect.iscoroutinefunction(handle)


#: the ready-made handlers, once the top-level package `handlers`, now queasy_py.handlers
READY_MADE = {"handlers.dead_letter", "handlers.reschedule"}


def moved_hint(path: str, exc: Exception) -> str:
    """Where a ready-made handler named by its old, gone name is now."""
    if path in READY_MADE and isinstance(exc, ModuleNotFoundError):
        return f" (the ready-made handlers moved: name it 'queasy_py.{path}')"
    return ""
