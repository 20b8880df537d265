"""queasy_py: a Redis-backed job runtime for Python.

Names are imported lazily (PEP 562), so a worker process that only needs the errors and the
Job type does not pay for importing redis-py at start.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import (
    AuthenticationFailed,
    ConfigError,
    ConnectionFailed,
    HandlerError,
    InvalidInput,
    PermanentError,
    QueasyError,
    RetryLater,
    VersionMismatch,
)
from .job import Job, JobInfo, ScheduleInfo

if TYPE_CHECKING:
    from .client import Client
    from .queue import Queue

_LAZY = {"Client": ".client", "Queue": ".queue"}

__all__ = [
    "AuthenticationFailed",
    "Client",
    "ConfigError",
    "ConnectionFailed",
    "HandlerError",
    "InvalidInput",
    "Job",
    "JobInfo",
    "PermanentError",
    "QueasyError",
    "Queue",
    "RetryLater",
    "ScheduleInfo",
    "VersionMismatch",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'queasy_py' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value
