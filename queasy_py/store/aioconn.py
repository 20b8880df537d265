"""AsyncClient's connection: made for its URL (one server or a Redis Cluster), and readied.

On one server, an AsyncReloadingRedis (a library call that finds the library gone loads it:
store/aiocalls.py) whose pool checks a connection before handing it out (pool_checks), and
the writes sent once (AsyncWrites); on a `redis+cluster://` URL, redis-py's asyncio
RedisCluster with FCALL routed by its key (store/aiocluster.py), and no AsyncWrites. And
the one read of AsyncQueue whose round trip differs on a cluster (time_and_hash).
"""

from __future__ import annotations

from typing import Any

import redis

from ..errors import ConnectionFailed
from .aiocalls import AsyncReloadingRedis, AsyncWrites
from .aiocluster import async_cluster_client, ready_cluster
from .connection import from_url, is_cluster_url, mask_url, producer_options
from .library import handshake, run_handshake_async


def async_connection(url: str, server: Any = None) -> tuple[Any, AsyncWrites | None]:
    """The redis client for `url` (it connects on its first command), and the writes on one
    server, sent once (None on a cluster). ConfigError naming the masked URL for a URL that
    does not parse; `server` (the embedded server the URL was resolved to, if any) is closed
    then."""
    try:
        if is_cluster_url(url):  # redis-py's asyncio RedisCluster, FCALL routed by its key
            return async_cluster_client(url), None
        # a library call that finds the library gone loads it (store/aiocalls.py)
        r = from_url(AsyncReloadingRedis, url, **producer_options(), **pool_checks())
        r.where = f"Redis at {mask_url(url)}"
        return r, AsyncWrites(r)
    except BaseException:
        if server is not None:
            server.close()
        raise


async def ready_connection(r: Any, url: str) -> str:
    """Connect and run the version handshake (on every primary of a cluster); the library's
    version in use. ConnectionFailed naming the masked URL when the server does not answer."""
    if is_cluster_url(url):  # ConnectionFailed or AuthenticationFailed naming the URL
        return await ready_cluster(r, url)
    try:
        return await run_handshake_async(r, handshake())
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise ConnectionFailed(f"cannot connect to Redis at {mask_url(url)}: {exc}") from None


async def time_and_hash(r: Any, key: str, cluster: bool) -> tuple[float, dict[Any, Any]]:
    """The server's time (seconds) and the fields of hash `key`, in one round trip on one
    server. On a cluster TIME, which has no key, is asked of the primary of `key`, as
    Client.supervisors() does (redis-py's default node may be down)."""
    if cluster:
        seconds, micros = await r.time(target_nodes=r.get_node_from_key(key))
        entries = await r.hgetall(key)
    else:
        async with r.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.hgetall(key)
            (seconds, micros), entries = await pipe.execute()
    return seconds + micros / 1e6, entries


def pool_checks() -> dict[str, Any]:
    """redis-py 8's asyncio pool skips its check of a connection before handing it out
    (closed by the server: a restart between two calls) while maintenance notifications are
    on, their default 'auto' on a TCP connection: the first call after a restart then failed
    on the dead connection. Off here, the pool replaces it, as the sync one does. (redis-py
    before 7 has neither the notifications nor the skip.)"""
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:
        return {}
    return {"maint_notifications_config": MaintNotificationsConfig(enabled=False)}
