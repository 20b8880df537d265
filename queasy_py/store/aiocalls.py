"""AsyncClient's writes on one server: sent once, as store/calls.py sends Client's.

redis-py reports a reply lost after the command went out as it reports a connection never
made ("cannot reach Redis"), and with a URL's retry options it sends the command again: a
write sent twice is not the same write (calls.py). Here a write takes a connection of the
client's pool, which checks it (one the server closed, a restarted server's, is connected
again before anything is sent: store/aioconn.pool_checks; a refused connection is redis-py's
ConnectionError, "cannot reach Redis"), sends its commands once and reads their replies. A
connection lost after that raises ConnectionFailed saying the server may have applied it
(calls.lost_reply); nothing is sent again, not even a send that failed: asyncio's transport
may still flush what it buffered when it is closed. A call the server refused with "Function
not found" did not run: it is sent again once the library is loaded (the version handshake;
AsyncReloadingRedis, the AsyncClient's redis client, which does the same for its own library
calls: store/reloading.py's, awaitable).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import hiredis
import redis
import redis.asyncio as aioredis

from .calls import lost_reply
from .library import handshake, library_key, library_reloaded, run_handshake_async
from .reload import gone_calls, put_back, raise_first, sent_again_if_gone_async
from .upgrading import (
    sent_again_if_upgrading_async,
    upgrade_call,
    upgraded_async,
    upgrading_calls,
)

log = logging.getLogger("queasy_py")


class AsyncReloadingRedis(aioredis.Redis):
    """store/reloading.ReloadingRedis for asyncio: a library call (FCALL, FCALL_RO with
    keys) refused because the server lost the library is sent again once it is loaded."""

    #: the server, as the WARNING names it ("Redis at <masked URL>": AsyncClient sets it)
    where = "Redis"

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        send = functools.partial(super().execute_command, *args, **options)
        key = library_key(args)
        if key is None:
            return await send()
        return await sent_again_if_upgrading_async(
            lambda: sent_again_if_gone_async(send, lambda: self.load_library(gone=True)),
            functools.partial(super().execute_command, *upgrade_call(key)),
        )

    async def load_library(self, key: str | None = None, gone: bool = False) -> str:
        """ReloadingRedis.load_library: the version handshake; its version."""
        version = await run_handshake_async(self, handshake())
        if gone:
            log.warning(library_reloaded(self.where, version))
        return version


class AsyncWrites:
    """The writes of an AsyncClient on one server (calls.FastCall's, awaitable)."""

    def __init__(self, r: AsyncReloadingRedis) -> None:
        self._redis = r
        self._pool = r.connection_pool

    async def __call__(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """FCALL `name`: its reply (a ResponseError raised as it is)."""
        command = ("FCALL", name, len(keys), *keys, *args)
        return (await self._send([command], name, keys))[0]

    async def command(self, *parts: Any) -> Any:
        """Any other write (DEL)."""
        return (await self._send([parts], str(parts[0])))[0]

    async def pipelined(self, name: str, keys: list[str], chunks: list[list[Any]]) -> list[Any]:
        """FCALL `name` once per chunk of arguments, pipelined in one round trip: their
        replies, or the first error reply raised once all were read."""
        commands = [("FCALL", name, len(keys), *keys, *args) for args in chunks]
        return await self._send(commands, f"{len(chunks)} pipelined {name} calls", keys)

    async def _send(
        self, commands: list[tuple[Any, ...]], what: str, keys: list[str] | None = None
    ) -> list[Any]:
        """Their replies, or the first error reply raised once all were read; the calls
        refused because the server lost the library (none of them ran) sent again, in their
        order, once it is loaded; so are those refused while the queues of `keys` were being
        upgraded from library 4.x, once they are (queasy_upgrade)."""
        replies = await self._replies(commands, what)
        gone = gone_calls(replies)
        if gone:
            await self._redis.load_library(gone=True)
            put_back(replies, gone, await self._replies([commands[i] for i in gone], what))
        refused = upgrading_calls(replies)
        if refused and keys:
            for key in keys:
                await upgraded_async(lambda key=key: self._upgrade(key, what))
            put_back(replies, refused, await self._replies([commands[i] for i in refused], what))
        return raise_first(replies)

    async def _upgrade(self, key: str, what: str) -> Any:
        """One call of queasy_upgrade on the queue of `key`: the records left (an error
        reply raised)."""
        reply = (await self._replies([upgrade_call(key)], what))[0]
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def _replies(self, commands: list[tuple[Any, ...]], what: str) -> list[Any]:
        """One round trip: the replies, an error reply in its place."""
        packed = b"".join(hiredis.pack_command(command) for command in commands)
        conn = await self._pool.get_connection()  # connected and checked: nothing sent yet
        try:
            replies = await self._roundtrip(conn, packed, len(commands), what)
        except BaseException:
            await conn.disconnect(nowait=True)  # a reply may be on its way: never reused
            raise
        finally:
            await self._pool.release(conn)
        return replies

    @staticmethod
    async def _roundtrip(conn: Any, packed: bytes, count: int, what: str) -> list[Any]:
        try:
            await conn.send_packed_command([packed], check_health=False)
            replies: list[Any] = []
            for _ in range(count):
                try:
                    replies.append(await conn.read_response())
                except redis.ResponseError as exc:  # read whole: the connection stays in step
                    replies.append(exc)
            return replies
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            raise lost_reply(what, exc) from exc
