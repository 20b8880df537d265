"""The Lua function library: loading, the version handshake, and typed FCALL wrappers."""

from __future__ import annotations

import enum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import redis

from .errors import QueasyError, VersionMismatch


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


def installed_version(r: redis.Redis) -> str | None:
    try:
        value = r.fcall_ro("queasy_version", 0)
    except redis.ResponseError as exc:
        message = str(exc).lower()
        if "function not found" in message:
            return None
        if "unknown command" in message:
            raise QueasyError(
                "this server has no Redis Functions (FCALL): queasy_py needs Redis >= 7.0 "
                f"or Valkey >= 7.2 ({exc})"
            ) from exc
        raise
    return value.decode() if isinstance(value, bytes) else str(value)


def ensure_loaded(r: redis.Redis) -> str:
    """Load the bundled library when the server's is missing or older; return the version used.

    Raises VersionMismatch when the server holds a newer major version.
    """
    bundled = bundled_version()
    installed = installed_version(r)
    if installed is not None:
        have, want = parse_version(installed), parse_version(bundled)
        if have[0] > want[0]:
            raise VersionMismatch(
                f"the server holds queasy library {installed}, a newer major version than "
                f"{bundled} bundled with this queasy_py; upgrade queasy_py"
            )
        if have >= want:
            return installed
    try:
        r.function_load(source(), replace=True)
    except redis.ResponseError as exc:
        if "unknown command" in str(exc).lower():
            raise QueasyError(
                "this server has no Redis Functions (FUNCTION LOAD): queasy_py needs "
                f"Redis >= 7.0 or Valkey >= 7.2 ({exc})"
            ) from exc
        raise
    return bundled


def fcall(r: Any, name: str, keys: list[str], args: list[Any]) -> Any:
    """FCALL on a connection or a pipeline."""
    return r.fcall(name, len(keys), *keys, *args)
