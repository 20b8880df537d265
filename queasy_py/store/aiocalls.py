"""AsyncClient's writes on one server: sent once, as store/calls.py sends Client's.

redis-py's asyncio client sends a command again after a lost reply (its Retry), and a write
sent twice is not the same write (calls.py). Here a write takes a connection of the client's
pool (the pool connects it; one the server closed, a restarted server's, is connected again
here before anything is sent: redis-py's pool hands it out as it is while its maintenance
notifications are on, their default; a refused connection is redis-py's ConnectionError,
"cannot reach Redis"), sends its commands
once and reads their replies. A connection lost after that raises ConnectionFailed saying the
server may have applied it (calls.lost_reply); nothing is sent again, not even a send that
failed: asyncio's transport may still flush what it buffered when it is closed.
"""

from __future__ import annotations

from typing import Any

import hiredis
import redis
import redis.asyncio as aioredis

from .calls import lost_reply, raise_refused


class AsyncWrites:
    """The writes of an AsyncClient on one server (calls.FastCall's, awaitable)."""

    def __init__(self, r: aioredis.Redis) -> None:
        self._pool = r.connection_pool

    async def __call__(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """FCALL `name`: its reply (a ResponseError raised as it is)."""
        command = ("FCALL", name, len(keys), *keys, *args)
        return (await self._send([command], name))[0]

    async def command(self, *parts: Any) -> Any:
        """Any other write (DEL)."""
        return (await self._send([parts], str(parts[0])))[0]

    async def pipelined(self, name: str, keys: list[str], chunks: list[list[Any]]) -> list[Any]:
        """FCALL `name` once per chunk of arguments, pipelined in one round trip: their
        replies, or the first error reply raised once all were read."""
        commands = [("FCALL", name, len(keys), *keys, *args) for args in chunks]
        return await self._send(commands, f"{len(chunks)} pipelined {name} calls")

    async def _send(self, commands: list[tuple[Any, ...]], what: str) -> list[Any]:
        packed = b"".join(hiredis.pack_command(command) for command in commands)
        conn = await self._pool.get_connection()  # connected: nothing sent yet
        try:
            await _in_step(conn)
            replies = await self._roundtrip(conn, packed, len(commands), what)
        except BaseException:
            await conn.disconnect(nowait=True)  # a reply may be on its way: never reused
            raise
        finally:
            await self._pool.release(conn)
        return raise_refused(replies)

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


async def _in_step(conn: Any) -> None:
    """Connect `conn` again when the server closed it (its EOF read: a restarted server) or
    it holds a stray reply; nothing was sent on it yet. A refused connection raises
    redis-py's ConnectionError (cannot reach Redis: nothing sent)."""
    try:
        # redis-py 8's can_read; can_read_destructive before (deprecated in 8)
        stale = await (getattr(conn, "can_read", None) or conn.can_read_destructive)()
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        stale = True
    if stale:
        await conn.disconnect()
        await conn.connect()
