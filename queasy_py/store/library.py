"""The Lua function library: loading, the version handshake, and typed FCALL wrappers."""

from __future__ import annotations

import enum
import re
from collections.abc import Generator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import InvalidInput, QueasyError, VersionMismatch
from .lazyredis import redis


class Dispatched(enum.IntEnum):
    CREATED = 1
    UPDATED = 2
    BLOCKED = 3
    BLOCKED_UPDATED = 4
    SKIPPED = 5  # queasy_dispatch_once: the id is active, or ran within its window


class Ack(enum.IntEnum):
    OK = 0
    STALE = 1


class Status(enum.IntEnum):
    OK = 0
    SWEPT = 2


@cache
def source() -> str:
    """The bundled library's source (installed in the wheel as queasy_py/lua/queasy.lua).

    A source checkout (lua/queasy.lua beside the package) uses its own file: an editable
    install maps queasy_py.lua to the checkout it was made from, which may be another one
    (a git worktree run with PYTHONPATH)."""
    checkout = Path(__file__).resolve().parent.parent.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "lua" / "queasy.lua").is_file():
        return (checkout / "lua" / "queasy.lua").read_text()
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
    """True when `exc` says the function called is not loaded; raises for a server without
    Functions and for a user not allowed to call them."""
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


#: the versions of queasy_py's library before it had the queasy_library marker
LEGACY_VERSION = re.compile(r"1\.[01]\.\d+")


def foreign(detail: str) -> VersionMismatch:
    return VersionMismatch(
        f"the server holds a function library named 'queasy' that is not queasy_py's "
        f"({detail}; the Node.js Queasy uses that name); queasy_py never replaces it: use "
        "another Redis server, or remove it with FUNCTION DELETE queasy if it is unused"
    )


def marked_version(reply: Any) -> str:
    """The version in the reply of queasy_library ('queasy_py 1.2.0'); raises for another."""
    text = decode_version(reply)
    owner, _, version = text.partition(" ")
    if owner != "queasy_py" or not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise foreign(f"its queasy_library returned {text!r}")
    return version


def legacy_version(reply: Any) -> str:
    """The version in the reply of queasy_version of a library without the marker: one of
    queasy_py 1.0/1.1 (a string), else a foreign library (the Node.js one returns 1)."""
    if isinstance(reply, bytes | str) and LEGACY_VERSION.fullmatch(decode_version(reply)):
        return decode_version(reply)
    raise foreign(f"its queasy_version returned {reply!r}")


def write_flagged(exc: Exception) -> bool:
    """True when FCALL_RO was refused because the function lacks the no-writes flag."""
    return "write flag" in str(exc).lower()


#: one step of the handshake: (method of redis.Redis, args); answered with (ok, reply or exc)
Step = tuple[str, tuple[Any, ...]]
Handshake = Generator[Step, tuple[bool, Any], str]


def probe() -> Handshake:
    """Steps that find the version of queasy_py's library on the server (None: no library
    named 'queasy' answers): queasy_library (since 1.2.0), else the queasy_version string of
    1.0/1.1; VersionMismatch for a foreign library named 'queasy'."""
    ok, reply = yield ("fcall_ro", ("queasy_library", 0))
    if ok:
        return marked_version(reply)
    if not missing_library(reply):
        raise reply
    ok, reply = yield ("fcall_ro", ("queasy_version", 0))
    if not ok and write_flagged(reply):  # an old one registered without no-writes
        ok, reply = yield ("fcall", ("queasy_version", 0))
    if ok:
        if isinstance(reply, bytes | str) and LEGACY_VERSION.fullmatch(decode_version(reply)):
            return decode_version(reply)
        # ours may have been loaded between the two calls (another client that found it
        # gone: after FUNCTION FLUSH, a restart): its marker answers now
        marked, again = yield ("fcall_ro", ("queasy_library", 0))
        if marked:
            return marked_version(again)
        return legacy_version(reply)
    if not missing_library(reply):
        raise reply
    return None  # type: ignore[return-value]


def handshake() -> Handshake:
    """The version handshake, as steps that a sync or an async driver runs; returns the
    version in use. An older library of ours is replaced; a newer major one, or a foreign
    library named 'queasy', is refused (VersionMismatch), never replaced."""
    for _ in range(2):
        installed = yield from probe()
        if not needs_load(installed):
            return installed
        ok, reply = yield ("function_load", (source(), installed is not None))
        if ok:
            return bundled_version()
        if isinstance(reply, redis.exceptions.NoPermissionError):
            raise QueasyError(
                f"the Redis user may not load the queasy library {bundled_version()} ({reply}); "
                "load it once as an admin, or grant FUNCTION|LOAD (README, Security)"
            ) from reply
        if "already exists" not in str(reply).lower():
            raise (no_functions(reply) or reply) from reply
        # a library named 'queasy' without our functions, or ours loaded meanwhile: look again
    raise foreign("it has neither queasy_library nor queasy_version")


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


def run_handshake(r: redis.Redis, steps: Handshake) -> str:
    answer: tuple[bool, Any] | None = None
    while True:
        try:
            method, args = steps.send(answer)  # type: ignore[arg-type]
        except StopIteration as stop:
            return stop.value
        try:
            answer = (True, getattr(r, method)(*args))
        except redis.ResponseError as exc:
            answer = (False, exc)


async def run_handshake_async(r: Any, steps: Handshake) -> str:
    answer: tuple[bool, Any] | None = None
    while True:
        try:
            method, args = steps.send(answer)  # type: ignore[arg-type]
        except StopIteration as stop:
            return stop.value
        try:
            answer = (True, await getattr(r, method)(*args))
        except redis.ResponseError as exc:
            answer = (False, exc)


def installed_version(r: redis.Redis) -> str | None:
    """The version of queasy_py's library on the server, None when there is none; raises
    VersionMismatch for a foreign library named 'queasy'."""
    return run_handshake(r, probe())  # type: ignore[arg-type]


def ensure_loaded(r: redis.Redis) -> str:
    """Load the bundled library when the server's is missing or older; return the version used.

    Raises VersionMismatch when the server holds a newer major version or a foreign library
    named 'queasy'.

    On a Redis Cluster client (redis-py's RedisCluster): on every primary, the slot map read
    again first (a primary that joined or was promoted since gets the library too); the
    newest version in use is returned.
    """
    if hasattr(r, "get_primaries"):
        r.nodes_manager.initialize()  # type: ignore[attr-defined]
        versions = [
            run_handshake(r.get_redis_connection(node), handshake())  # type: ignore[attr-defined]
            for node in r.get_primaries()  # type: ignore[attr-defined]
        ]
        return max(versions, key=parse_version)
    return run_handshake(r, handshake())


#: the commands that call the library's functions (name, numkeys, keys..., args...)
LIBRARY_CALLS = frozenset({"FCALL", "FCALL_RO"})


def library_gone(exc: BaseException) -> bool:
    """Whether `exc` is the reply to a library call that found no such function: nothing
    ran (the node lost the library: restarted empty, FUNCTION FLUSH, a node that joined)."""
    return isinstance(exc, redis.ResponseError) and "function not found" in str(exc).lower()


def library_key(args: tuple[Any, ...]) -> str | None:
    """The first key of a library call's command (FCALL name numkeys key...), else None."""
    if len(args) > 3 and str(args[0]).upper() in LIBRARY_CALLS and int(args[2]) > 0:
        return args[3]
    return None


def lua_error(exc: redis.ResponseError) -> Exception:
    """The library refuses bad arguments with an error reply 'INVALID <what>' (nothing
    written): that is InvalidInput; any other error is returned as it is."""
    text = str(exc)
    if text.startswith("INVALID "):
        return InvalidInput(f"the queasy library refused the call: {text[8:]}")
    return acl_denied(exc) or exc


def acl_denied(exc: Exception) -> QueasyError | None:
    """The clear error for a command or a library call that the Redis user's ACL refused (a
    key outside its `~PREFIX:*`, a channel outside its `&PREFIX:*`, a command not granted;
    redis-py's NoPermissionError, or 'ACL failure in script' from inside a function), else
    None."""
    text = str(exc)
    if not isinstance(exc, redis.exceptions.NoPermissionError) and (
        "no permissions" not in text.lower()
    ):
        return None
    return QueasyError(
        f"the Redis user is not allowed this ({text}); grant it the ACL line of the README's "
        "Security section: the keys ~PREFIX:* and channels &PREFIX:* of the client's prefix, "
        "and the commands listed there"
    )


def fcall(r: Any, name: str, keys: list[str], args: list[Any]) -> Any:
    """FCALL on a connection or a pipeline."""
    return r.fcall(name, len(keys), *keys, *args)


def library_reloaded(where: str, version: str) -> str:
    """The WARNING for a producer's call that found the library gone on `where` ("Redis at
    <masked URL>", "Redis Cluster primary host:port")."""
    return (
        f"the queasy library is gone on {where} (restarted empty, flushed or replaced); "
        f"loaded {version} there again and sent the call again"
    )
