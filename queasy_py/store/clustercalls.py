"""The library calls of a Redis Cluster client, one logic for the sync ClusterClient
(store/cluster.py) and the asyncio AsyncClusterClient (store/aiocluster.py), which only send
and wait their own way.

- FCALL's keys are read from the call itself (name, numkeys, keys...): no COMMAND GETKEYS
  round trip (KeysFromCall, AsyncKeysFromCall: the clients' commands parsers).
- A call refused because its slot is moving or unserved did not run: it is sent again with
  backoff for up to the client's `slot_wait` seconds (SlotWait).
- A library call is routed by its first key (routed_key); the version handshake is made first
  on a primary passed over at connect (unchecked_primary), and a call that found the library
  gone there is sent again once it is loaded (library_checked: its WARNING).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    SlotNotCoveredError,
    TryAgainError,
)

from .. import defaults
from .library import LIBRARY_CALLS, library_key, library_reloaded

log = logging.getLogger("queasy_py")

#: seconds a producer's call waits for a moving or unserved slot (ClusterClient.slot_wait)
SLOT_WAIT = defaults.SLOT_WAIT
#: commands whose keys follow their numkeys argument (name, numkeys, keys...)
_NUMKEYS_COMMANDS = frozenset({"fcall", "fcall_ro"})

#: replies that say a command did not run because its slot is moving or unserved for now
#: (the library's migration guard answers TRYAGAIN): sending it again is safe
SLOT_BUSY = (TryAgainError, ClusterDownError, AskError, SlotNotCoveredError)  # MOVED is an ASK


def numkeys_call(args: tuple[Any, ...]) -> bool:
    """Whether the command `args` names its keys after a numkeys argument (FCALL, FCALL_RO):
    numkeys_keys reads them; for any other command the wrapped parser is asked."""
    return len(args) > 2 and str(args[0]).lower() in _NUMKEYS_COMMANDS


def numkeys_keys(args: tuple[Any, ...]) -> list[Any] | None:
    """The keys of a numkeys_call, read from the call itself; None for a call of no key."""
    count = int(args[2])
    return list(args[3 : 3 + count]) if count else None


class KeysFromCall:
    """A redis-py commands parser that reads FCALL's keys from the call itself and asks the
    wrapped parser (COMMAND GETKEYS when needed) for every other command (ClusterClient's)."""

    def __init__(self, parser: Any) -> None:
        self._parser = parser

    def get_keys(self, redis_conn: Any, *args: Any) -> Any:
        if numkeys_call(args):
            return numkeys_keys(args)
        return self._parser.get_keys(redis_conn, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


class AsyncKeysFromCall:
    """KeysFromCall for asyncio (AsyncClusterClient's): FCALL's keys read from the call
    itself, the wrapped parser asked (COMMAND GETKEYS when needed) for every other command."""

    def __init__(self, parser: Any, client: Any) -> None:
        self._parser = parser
        self._client = client

    async def initialize(self, node: Any) -> None:
        """Read the command table (COMMAND) from `node`, redis-py's default node (the
        primary of slot 0), or when it does not answer (killed or frozen, not failed over;
        retries are off) from another primary of the slot map, which becomes the default."""
        try:
            return await self._parser.initialize(node)
        except (redis.ConnectionError, redis.TimeoutError):
            for other in self._client.get_primaries():
                if other is node:
                    continue
                try:
                    await self._parser.initialize(other)
                except (redis.ConnectionError, redis.TimeoutError):
                    continue
                self._client.nodes_manager.default_node = other
                return None
            raise

    async def get_keys(self, *args: Any) -> Any:
        if numkeys_call(args):
            keys = numkeys_keys(args)
            return tuple(keys) if keys else None
        return await self._parser.get_keys(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


def slot_busy(exc: BaseException) -> bool:
    """Whether a producer's call refused with `exc` waits (ClusterClient.slot_wait) and is
    sent again: one of SLOT_BUSY (CLUSTERDOWN too: a ClusterError of redis-py's), or
    redis-py's redirections ran out (a ClusterError "TTL exhausted": ASK, then TRYAGAIN...)."""
    return isinstance(exc, SLOT_BUSY) or (
        isinstance(exc, ClusterError) and "TTL exhausted" in str(exc)
    )


class SlotWait:
    """The waits of one call refused because its slot is moving or unserved: 20 ms, doubling
    up to 0.5 s, for up to `seconds` in all. Catch (*SLOT_BUSY, ClusterError) around the
    send, ask after() how long to wait, and raise the error when it answers None."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.delay = 0.02

    def after(self, exc: BaseException) -> float | None:
        """Seconds to wait before sending the call again after `exc`; None when `exc` is not
        a busy slot or the wait would pass the deadline (CLUSTERDOWN still: the caller raises
        it, ConnectionFailed naming the call: connfailed)."""
        if not slot_busy(exc) or time.monotonic() + self.delay > self.deadline:
            return None
        delay, self.delay = self.delay, min(self.delay * 2, 0.5)
        return delay


def routed_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The first key of a library call (FCALL or FCALL_RO) routed by it, whose primary the
    client checks and whose lost library it loads again; None for another command, a call
    of no key, or one sent to named nodes (target_nodes)."""
    if str(args[0]).upper() not in LIBRARY_CALLS or "target_nodes" in kwargs:
        return None
    return library_key(args)


def unchecked_primary(rc: Any, key: str) -> bool:
    """Whether the primary of `key` was passed over at connect (its version handshake not
    made yet: rc.unchecked, host:port names)."""
    return bool(rc.unchecked) and rc.get_node_from_key(key).name in rc.unchecked


def library_checked(rc: Any, node: Any, version: str, gone: bool) -> str:
    """After the version handshake on `node`: it is checked; `gone` (a call found the library
    gone there) says so in a WARNING. The version."""
    rc.unchecked.discard(node.name)
    if gone:
        log.warning(library_reloaded(f"Redis Cluster primary {node.name}", version))
    return version


def passed_over(unanswered: list[str]) -> str:
    """The WARNING for primaries that did not answer the version handshake at connect."""
    return (
        f"Redis Cluster primary {', '.join(unanswered)} does not answer: the queasy library "
        "was not checked there (it will be before the first call of its queues); the calls "
        "of its queues fail until it answers again or the cluster fails it over, the other "
        "queues work"
    )
