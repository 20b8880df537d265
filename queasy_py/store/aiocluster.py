"""Redis Cluster for AsyncClient: the asyncio twin of store/cluster.py's ClusterClient.

redis-py's asyncio RedisCluster, FCALL routed by its first key (read from the call itself:
no COMMAND GETKEYS round trip), a call refused because its slot is moving or unserved sent
again with backoff for up to `slot_wait` seconds, the function library loaded on every
primary. The URL is the sync client's (`redis+cluster://...`, parse_cluster_url).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.backoff import NoBackoff
from redis.exceptions import ClusterError, RedisClusterException
from redis.retry import Retry

from ..errors import AuthenticationFailed, ConnectionFailed
from .cluster import refused_credentials
from .clustercalls import (
    SLOT_BUSY,
    SLOT_WAIT,
    AsyncKeysFromCall,
    SlotWait,
    library_checked,
    passed_over,
    routed_key,
    unchecked_primary,
)
from .clusterurl import parse_cluster_url
from .connection import producer_options
from .library import handshake, parse_version, run_handshake_async
from .reload import sent_again_if_gone_async
from .upgrading import maybe_upgrading, upgrade_call, upgraded_async

log = logging.getLogger("queasy_py")


class AsyncClusterClient(RedisCluster):
    """asyncio RedisCluster routing FCALL by its first key, waiting out a moving or unserved
    slot for up to `slot_wait` seconds (a producer sees a delay, not an error)."""

    slot_wait = SLOT_WAIT

    def __init__(self, *args: Any, node_options: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands_parser = AsyncKeysFromCall(self.commands_parser, self)  # pipelines share it
        #: the options of a plain connection to one node (the version handshake's)
        self.node_options = node_options
        #: host:port of the primaries passed over by ready_cluster (ClusterClient.unchecked)
        self.unchecked: set[str] = set()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """ClusterClient.execute_command's waits, and its library calls (_library_call)."""
        key = routed_key(args, kwargs)
        if key is None:
            return await self._waiting(*args, **kwargs)
        await self.check_library(key)
        return await sent_again_if_gone_async(
            lambda: self._waiting(*args, _queue=key, **kwargs),
            lambda: self.load_library(key, gone=True),
        )

    async def check_library(self, key: str) -> None:
        """ClusterClient.check_library."""
        if unchecked_primary(self, key):
            await self.load_library(key)

    async def load_library(self, key: str, gone: bool = False) -> str:
        """ClusterClient.load_library: the version handshake on the primary of `key`."""
        node = self.get_node_from_key(key)
        version = await handshake_at(node, self.node_options)
        return library_checked(self, node, version, gone)

    async def _waiting(self, *args: Any, _queue: str | None = None, **kwargs: Any) -> Any:
        """ClusterClient._waiting, awaitable (store/clustercalls.SlotWait; a read of a queue
        being upgraded from library 4.x too)."""
        waits = SlotWait(self.slot_wait)
        while True:
            try:
                return await super().execute_command(*args, **kwargs)
            except (*SLOT_BUSY, ClusterError) as exc:
                if _queue is not None and maybe_upgrading(exc):
                    upgrade = functools.partial(self._waiting, *upgrade_call(_queue))
                    _queue = None
                    await upgraded_async(upgrade)
                    continue
                delay = waits.after(exc)
                if delay is None:
                    raise
                await asyncio.sleep(delay)


def async_cluster_client(url: str) -> AsyncClusterClient:
    """An AsyncClusterClient for `url` (ConfigError naming the masked URL when it does not
    parse); it connects on its first command (ready_cluster). redis-py never sends a command
    twice (retries off), as for the sync ClusterClient."""
    nodes, options = parse_cluster_url(url)
    return AsyncClusterClient(
        startup_nodes=[ClusterNode(node.host, node.port) for node in nodes],
        **{**producer_options(), **options},
        retry=Retry(NoBackoff(), 0),
        node_options={**producer_options(), **options},
    )


async def handshake_at(node: Any, options: dict[str, Any]) -> str:
    """The version handshake on one node, over a plain connection of its own: each call
    sent once (redis-py's default retries a timeout 10 times: a frozen primary held ready()
    for a minute)."""
    r = aioredis.Redis(host=node.host, port=node.port, **options, retry=Retry(NoBackoff(), 0))
    try:
        return await run_handshake_async(r, handshake())
    finally:
        await r.aclose()


async def ready_cluster(rc: AsyncClusterClient, url: str) -> str:
    """Read the slot map and run the version handshake on every primary; the newest version
    in use. ConnectionFailed when no node answers, AuthenticationFailed for refused
    credentials (both naming the masked URL)."""
    from .connection import mask_url

    try:
        await rc.initialize()
    except redis.AuthenticationError as exc:
        raise AuthenticationFailed(
            f"Redis Cluster at {mask_url(url)} refused the credentials: {exc}"
        ) from None
    except (RedisClusterException, redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        if refused_credentials(exc):
            raise AuthenticationFailed(
                f"Redis Cluster at {mask_url(url)} refused the credentials: {exc.__cause__}"
            ) from None
        raise ConnectionFailed(
            f"cannot connect to Redis Cluster at {mask_url(url)}: {exc}"
        ) from None
    versions = []
    unanswered: list[str] = []  # primaries passed over, as store/cluster.load_everywhere does
    primaries = rc.get_primaries()
    for node in primaries:
        try:
            versions.append(await handshake_at(node, rc.node_options))
        except redis.AuthenticationError as exc:  # a primary with other credentials
            raise AuthenticationFailed(
                f"Redis Cluster at {mask_url(url)} refused the credentials: {exc}"
            ) from None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            unanswered.append(f"{node.host}:{node.port} ({exc})")
            rc.unchecked.add(node.name)  # checked before its first library call
            if len(unanswered) == len(primaries):  # none answers
                raise ConnectionFailed(
                    f"cannot connect to Redis Cluster at {mask_url(url)}: no primary answers: {exc}"
                ) from None
    if unanswered:
        log.warning(passed_over(unanswered))
    return max(versions, key=parse_version)
