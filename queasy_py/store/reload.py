"""Library calls sent again when the server lost the library, and pipelined library calls.

A library call refused with "Function not found" did not run (the server restarted empty,
FUNCTION FLUSH, a cluster node that joined): it is sent again once the version handshake
loaded the library (sent_again_if_gone). Of a pipeline's replies (an error reply in its
place), those refused so are sent again in their order (gone_calls, put_back), and the first
error left is raised, marked with the calls that ran (raise_first). fcall_pipelined sends a
queue's pipelined calls through redis-py, on one server or a cluster.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .lazyredis import redis
from .library import fcall, library_gone


def sent_again_if_gone(send: Callable[[], Any], load: Callable[[], object]) -> Any:
    """send() (a library call); when its reply says the library is gone (nothing ran), load()
    (the version handshake: VersionMismatch as at connect) and send() once more."""
    try:
        return send()
    except redis.ResponseError as exc:
        if not library_gone(exc):
            raise
    load()
    return send()


async def sent_again_if_gone_async(
    send: Callable[[], Awaitable[Any]], load: Callable[[], Awaitable[object]]
) -> Any:
    """sent_again_if_gone, awaitable."""
    try:
        return await send()
    except redis.ResponseError as exc:
        if not library_gone(exc):
            raise
    await load()
    return await send()


def gone_calls(replies: list[Any]) -> list[int]:
    """The indexes of a pipeline's replies (errors in place) that found the library gone."""
    return [i for i, reply in enumerate(replies) if library_gone(reply)]


def down_calls(replies: list[Any]) -> list[int]:
    """The indexes of a cluster pipeline's replies refused with CLUSTERDOWN (none ran)."""
    down = redis.exceptions.ClusterDownError
    return [i for i, reply in enumerate(replies) if isinstance(reply, down)]


def put_back(replies: list[Any], gone: list[int], again: list[Any]) -> list[Any]:
    """`replies` with those of the calls `gone` replaced by `again` (theirs, sent again in
    their order after the library was loaded: none of them had run)."""
    for i, reply in zip(gone, again, strict=True):
        replies[i] = reply
    return replies


def fcall_pipelined(r: Any, name: str, key: str, chunks: list[list[Any]]) -> list[Any]:
    """FCALL `name` on `key` once per chunk of arguments, pipelined in one round trip; the
    replies, or the first error raised. On a cluster (a store/cluster.ClusterClient), the
    primary of `key` passed over at connect is checked first, and calls refused because it
    lost the library (none of them ran) are sent again once it is loaded there."""
    check = getattr(r, "check_library", None)
    if check is not None:
        check(key)
    with r.pipeline(transaction=False) as pipe:
        for args in chunks:
            fcall(pipe, name, [key], args)
        replies = pipe.execute(raise_on_error=False)
    if check is not None:  # redis-py's pipeline sends again MOVED, ASK, TRYAGAIN: CLUSTERDOWN
        down = down_calls(replies)  # too, each through the client, which waits it out
        put_back(replies, down, [_reply(r, name, key, chunks[i]) for i in down])
    gone = gone_calls(replies)
    if gone and check is not None:
        r.load_library(key, gone=True)
        # in their order, after those that ran (none, unless another client loaded the
        # library there while the pipeline ran)
        put_back(replies, gone, [_reply(r, name, key, chunks[i]) for i in gone])
    return raise_first(replies)


def _reply(r: Any, name: str, key: str, args: list[Any]) -> Any:
    """FCALL `name` on `key` alone: its reply, or its error reply."""
    try:
        return fcall(r, name, [key], args)
    except redis.ResponseError as exc:
        return exc


async def fcall_pipelined_async(r: Any, name: str, key: str, chunks: list[list[Any]]) -> list:
    """fcall_pipelined on an asyncio client (store/aiocluster.AsyncClusterClient)."""
    check = getattr(r, "check_library", None)
    if check is not None:
        await check(key)
    async with r.pipeline(transaction=False) as pipe:
        for args in chunks:
            fcall(pipe, name, [key], args)
        replies = await pipe.execute(raise_on_error=False)
    if check is not None:  # fcall_pipelined's CLUSTERDOWN
        down = down_calls(replies)
        put_back(replies, down, [await _reply_async(r, name, key, chunks[i]) for i in down])
    gone = gone_calls(replies)
    if gone and check is not None:
        await r.load_library(key, gone=True)
        put_back(replies, gone, [await _reply_async(r, name, key, chunks[i]) for i in gone])
    return raise_first(replies)


async def _reply_async(r: Any, name: str, key: str, args: list[Any]) -> Any:
    try:
        return await fcall(r, name, [key], args)
    except redis.ResponseError as exc:
        return exc


def raise_first(replies: list[Any]) -> list[Any]:
    """The replies of pipelined calls, or the first error reply raised, its `applied` the
    indexes of the calls that were not refused (a pipeline is not one step: those ran)."""
    first = next((reply for reply in replies if isinstance(reply, Exception)), None)
    if first is None:
        return replies
    first.applied = [  # type: ignore[attr-defined]
        i for i, reply in enumerate(replies) if not isinstance(reply, Exception)
    ]
    raise first
