"""The Lua function library: loading, the version handshake, and typed FCALL wrappers."""

from __future__ import annotations

import enum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import redis

from ..errors import QueasyError, VersionMismatch


class Dispatched(enum.IntEnum):
    CREATED = 1
    UPDATED = 2
    BLOCKED = 3
    BLOCKED_UPDATED = 4


class Ack(enum.IntEnum):
    OK = 0
    STALE = 1


class Status(enum.IntEnum):
    OK = 0
    SWEPT = 2


@cache
def source() -> str:
    """The bundled library's source (installed in the wheel as queasy_py/lua/queasy.lua)."""
    try:
        return resources.files("queasy_py.lua").joinpath("queasy.lua").read_text()
    except (ModuleNotFoundError, FileNotFoundError):  # pragma: no cover - odd layouts
        return (Path(__file__).resolve().parent.parent / "lua" / "queasy.lua").read_text()


@cache
def bundled_version() -> str:
    for line in source().splitlines():
        if line.startswith("local VERSION = "):
            return line.split("'")[1]
    raise QueasyError("lua/queasy.lua has no VERSION line")


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def no_functions(exc: Exception) -> QueasyError | None:
    """The clear error for a server without Redis Functions, if that is what `exc` says."""
    if "unknown command" in str(exc).lower():
        return QueasyError(
            "this server has no Redis Functions (FCALL/FUNCTION LOAD): queasy_py needs "
            f"Redis >= 7.0 or Valkey >= 7.2 ({exc})"
        )
    return None


def decode_version(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def missing_library(exc: redis.ResponseError) -> bool:
    """True when `exc` says the library is not loaded; raises for a server without Functions
    and for a user not allowed to call them."""
    if "function not found" in str(exc).lower():
        return True
    if isinstance(exc, redis.exceptions.NoPermissionError):
        raise QueasyError(
            f"the Redis user may not call the queasy functions ({exc}); grant it the ACL "
            "line of the README's Security section"
        ) from exc
    error = no_functions(exc)
    if error is not None:
        raise error from exc
    return False


def needs_load(installed: str | None) -> bool:
    """Whether to load the bundled library over `installed` (None: not loaded).

    Raises VersionMismatch when the server holds a newer major version.
    """
    if installed is None:
        return True
    bundled = bundled_version()
    have, want = parse_version(installed), parse_version(bundled)
    if have[0] > want[0]:
        raise VersionMismatch(
            f"the server holds queasy library {installed}, a newer major version than "
            f"{bundled} bundled with this queasy_py; upgrade queasy_py"
        )
    return have < want


def installed_version(r: redis.Redis) -> str | None:
    try:
        return decode_version(r.fcall_ro("queasy_version", 0))
    except redis.ResponseError as exc:
        if missing_library(exc):
            return None
        raise


def ensure_loaded(r: redis.Redis) -> str:
    """Load the bundled library when the server's is missing or older; return the version used.

    Raises VersionMismatch when the server holds a newer major version.
    """
    installed = installed_version(r)
    if not needs_load(installed):
        return installed  # type: ignore[return-value]
    try:
        r.function_load(source(), replace=True)
    except redis.exceptions.NoPermissionError as exc:
        raise QueasyError(
            f"the Redis user may not load the queasy library {bundled_version()} ({exc}); "
            "load it once as an admin, or grant FUNCTION|LOAD (README, Security)"
        ) from exc
    except redis.ResponseError as exc:
        raise (no_functions(exc) or exc) from exc
    return bundled_version()


def fcall(r: Any, name: str, keys: list[str], args: list[Any]) -> Any:
    """FCALL on a connection or a pipeline."""
    return r.fcall(name, len(keys), *keys, *args)
