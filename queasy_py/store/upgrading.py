"""Library 5.0's upgrade of a queue's 4.x keys, as the callers meet it: a call refused with
'TRYAGAIN upgrading <queue> ...' ran nothing but a step of the conversion (lua/queasy.lua,
queasy_upgrade); these helpers call queasy_upgrade until the queue is converted and send the
call again (README, "Upgrading to 5.0")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import redis

from ..errors import QueasyError

#: calls of queasy_upgrade that one call refused with 'TRYAGAIN upgrading' makes at most
#: (each converts up to 500 records of library 4.x: lua/queasy.lua UPGRADE_BUDGET)
MAX_UPGRADE_STEPS = 100_000


def upgrading(exc: BaseException) -> bool:
    """Whether `exc` is the library's refusal of a call on a queue whose keys of library 4.x
    are being converted into 5.0's ('TRYAGAIN upgrading <queue> ...'): nothing ran but a
    step of the conversion, so the call may be sent again once it is done."""
    return isinstance(exc, redis.exceptions.TryAgainError) and "upgrading " in str(exc)


def maybe_upgrading(exc: BaseException) -> bool:
    """upgrading(exc), or on a Redis Cluster redis-py's redirections ran out: it follows a
    TRYAGAIN as a moving slot's until its TTL runs out, and drops its text."""
    return upgrading(exc) or (
        isinstance(exc, redis.exceptions.ClusterError) and "TTL exhausted" in str(exc)
    )


def read_converting(r: Any, name: str, key: str, *args: Any) -> Any:
    """FCALL_RO `name` on the queue of base key `key` through `r` (a redis.Redis or a
    cluster client of the scheduling loop); refused while the queue's keys of library 4.x
    are not converted (a read cannot convert them): queasy_upgrade until they are, then the
    read once more (store/reloading.py does so for the producer's client)."""
    try:
        return r.fcall_ro(name, 1, key, *args)
    except (redis.exceptions.TryAgainError, redis.exceptions.ClusterError) as exc:
        if not maybe_upgrading(exc):
            raise
    upgraded(lambda: r.fcall("queasy_upgrade", 1, key, ""))
    return r.fcall_ro(name, 1, key, *args)


def upgrade_call(key: str) -> tuple[Any, ...]:
    """The command of queasy_upgrade on the queue of base key `key` (now: the server's)."""
    return ("FCALL", "queasy_upgrade", 1, key, "")


def upgraded(upgrade: Callable[[], Any]) -> None:
    """Call queasy_upgrade (`upgrade()`, its reply the records left) until the queue is in
    the 5.0 layout (0 left); each call converts a step (README, "Upgrading to 5.0")."""
    for _ in range(MAX_UPGRADE_STEPS):
        if int(upgrade()) == 0:
            return
    raise QueasyError(
        f"the queue's upgrade to library 5.0 did not end in {MAX_UPGRADE_STEPS} steps"
    )


async def upgraded_async(upgrade: Callable[[], Awaitable[Any]]) -> None:
    """upgraded, awaitable."""
    for _ in range(MAX_UPGRADE_STEPS):
        if int(await upgrade()) == 0:
            return
    raise QueasyError(
        f"the queue's upgrade to library 5.0 did not end in {MAX_UPGRADE_STEPS} steps"
    )


def sent_again_if_upgrading(send: Callable[[], Any], upgrade: Callable[[], Any]) -> Any:
    """send() (a library call); when it was refused because its queue is being upgraded from
    library 4.x (nothing ran), upgraded(upgrade) and send() once more."""
    try:
        return send()
    except redis.exceptions.TryAgainError as exc:
        if not upgrading(exc):
            raise
    upgraded(upgrade)
    return send()


async def sent_again_if_upgrading_async(
    send: Callable[[], Awaitable[Any]], upgrade: Callable[[], Awaitable[Any]]
) -> Any:
    """sent_again_if_upgrading, awaitable."""
    try:
        return await send()
    except redis.exceptions.TryAgainError as exc:
        if not upgrading(exc):
            raise
    await upgraded_async(upgrade)
    return await send()


def upgrading_calls(replies: list[Any]) -> list[int]:
    """The indexes of a pipeline's replies (errors in place) refused while their queue was
    being upgraded from library 4.x (none of them ran: those after the step that ended the
    upgrade did; they are sent again after them, as the calls that found the library gone)."""
    return [i for i, reply in enumerate(replies) if upgrading(reply)]
