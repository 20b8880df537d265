"""A generator function behind a functools.wraps decorator: `handle` is a plain function that
returns the generator, whose body never runs (refused at load, as a bare generator is)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from tests.runtime_handlers import record


def logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(data: Any, job: Any) -> Any:
        return fn(data, job)

    return wrapper


@logged
def handle(data: Any, job: Any) -> Any:
    record("start", data, job)
    yield None
