"""redis-py, imported on first use: `from .lazyredis import redis` in place of `import redis`.

Importing redis-py takes 0.15-0.2 s of CPU (more with the OpenTelemetry SDK installed, which
it imports too). The modules on the way to `Client.run()`'s first workers (the public API,
the CLI, the URL checks) name it only inside functions and `except` clauses, so with this
proxy nothing imports it before run() has started its workers: their start overlaps it.
The first attribute read imports redis-py and returns its attribute, as `import redis` would
have; every later read is a plain attribute of this object.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["redis"]


class _Lazy:
    """A stand-in for a module: its attributes are the module's, imported on first read."""

    def __init__(self, name: str) -> None:
        self.__name = name

    def __getattr__(self, attr: str) -> Any:
        value = getattr(importlib.import_module(self.__name), attr)
        setattr(self, attr, value)  # found directly from now on
        return value

    def __repr__(self) -> str:
        return f"<redis-py, imported on first use: {self.__name}>"


if TYPE_CHECKING:
    import redis as redis
else:
    redis = _Lazy("redis")
