"""Redis Cluster for the producer API: `redis+cluster://[user:password@]host:port[,host:port...]`.

Every key of a queue shares one hash tag, so every library call of a queue runs on the one
primary that owns the tag's slot. redis-py's RedisCluster routes FCALL by asking the server
for the command's keys (`COMMAND GETKEYS`, a round trip per call); ClusterClient reads the
keys from the call itself (FCALL name numkeys key...), for single calls and pipelines alike.
The function library is loaded on every primary (`load_everywhere`).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ClusterError, RedisClusterException
from redis.retry import Retry

from .. import defaults
from ..errors import AuthenticationFailed, ConfigError, ConnectionFailed
from .clustercalls import (
    SLOT_BUSY,
    SLOT_WAIT,
    KeysFromCall,
    SlotWait,
    library_checked,
    passed_over,
    routed_key,
    unchecked_primary,
)
from .clusterurl import parse_cluster_url
from .connection import is_cluster_url as is_cluster_url  # its home before
from .connection import producer_options
from .library import ensure_loaded, parse_version
from .reload import sent_again_if_gone
from .upgrading import maybe_upgrading, upgrade_call, upgraded

log = logging.getLogger("queasy_py")


#: keyless commands redis-py sends to its default node that may be sent again, to another
#: node, when it does not answer (they read only)
RESENDABLE = frozenset({"COMMAND", "TIME", "PING"})


class ClusterClient(RedisCluster):
    """RedisCluster routing FCALL by its first key, without a GETKEYS round trip.

    A call refused because its slot is moving (resharding) or unserved (a failover) is sent
    again with backoff for up to `slot_wait` seconds (redis-py alone gives up within half a
    second): a producer sees a delay, not an error. The scheduling loop's client does not
    wait (slot_wait 0): the loop backs off on its own."""

    slot_wait = SLOT_WAIT
    #: whether a library call that finds the library gone loads it there and is sent again
    #: (the producer's; the scheduling loop has its own reload: runtime/rounds.py)
    reloads_library = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands_parser = KeysFromCall(self.commands_parser)  # pipelines share it
        #: host:port of the primaries that did not answer the version handshake at connect
        #: (load_everywhere): it is made before the first library call sent there
        self.unchecked: set[str] = set()

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        """redis-py's cluster pipeline, whose commands refused for a moving slot are sent
        again one by one through this client's execute_command (waiting out the slot)."""
        pipe = super().pipeline(*args, **kwargs)
        pipe.parent_execute_command = self.execute_command
        return pipe

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        key = routed_key(args, kwargs)
        if key is not None and self.reloads_library:
            return self._library_call(key, *args, **kwargs)
        if str(args[0]).upper() not in RESENDABLE or "target_nodes" in kwargs:
            return self._waiting(*args, **kwargs)
        others = len(self.get_nodes()) - 1
        while True:
            try:
                return self._waiting(*args, **kwargs)
            except (redis.ConnectionError, redis.TimeoutError):
                # its default node does not answer (a primary killed or frozen, not failed
                # over: redis-py makes the primary of slot 0 the default, and sends COMMAND
                # there while it is made): another node, retries being off
                if others <= 0:
                    raise
                others -= 1
                self.replace_default_node()

    def _library_call(self, key: str, *args: Any, **kwargs: Any) -> Any:
        """FCALL or FCALL_RO routed by `key`: the version handshake made first on a primary
        passed over at connect; a call that finds the library gone there (nothing ran) is sent
        again, once, after the handshake loaded it (VersionMismatch, as at connect, for a
        newer major library or a foreign one named 'queasy')."""
        self.check_library(key)
        return sent_again_if_gone(
            lambda: self._waiting(*args, _queue=key, **kwargs),
            lambda: self.load_library(key, gone=True),
        )

    def check_library(self, key: str) -> None:
        """The version handshake on the primary of `key` if it was passed over at connect."""
        if unchecked_primary(self, key):
            self.load_library(key)

    def load_library(self, key: str, gone: bool = False) -> str:
        """The version handshake (store/library.py) on the primary of `key`, which loads the
        library there when it is missing or older; its version."""
        node = self.get_node_from_key(key)
        version = ensure_loaded(self.get_redis_connection(node))
        return library_checked(self, node, version, gone)

    def _waiting(self, *args: Any, _queue: str | None = None, **kwargs: Any) -> Any:
        """The call sent, a moving or unserved slot waited out (store/clustercalls.SlotWait).
        A library call on the queue `_queue` refused with 'TRYAGAIN upgrading' (its keys of
        library 4.x not converted yet: a read cannot convert them, a write converts a step),
        which redis-py follows as a moving slot's TRYAGAIN until its TTL runs out, makes
        queasy_upgrade convert them first (it answers 0 at once for a queue converted)."""
        waits = SlotWait(self.slot_wait)
        while True:
            try:
                return super().execute_command(*args, **kwargs)
            except (*SLOT_BUSY, ClusterError) as exc:
                if _queue is not None and maybe_upgrading(exc):
                    upgraded(functools.partial(self._waiting, *upgrade_call(_queue)))
                    _queue = None  # (converted: once is enough)
                    continue
                delay = waits.after(exc)
                if delay is None:
                    raise
                time.sleep(delay)


def connect_cluster(
    url: str,
    attempts: int = defaults.CONNECT_ATTEMPTS,
    backoff: float = defaults.CONNECT_BACKOFF,
) -> tuple[ClusterClient, str]:
    """A ClusterClient for `url` with the library loaded on every primary, and the library's
    version. ConnectionFailed (after `attempts` tries, backoff doubling) when no node answers,
    AuthenticationFailed for refused credentials, ConfigError for a server not in cluster mode.

    A command is never sent twice by redis-py (retries off): MOVED and ASK are followed, but
    a reply lost after sending raises, as for a single server (store/calls.py).
    """
    from .connection import mask_url

    nodes, options = parse_cluster_url(url)
    delay = backoff
    for attempt in range(1, attempts + 1):
        try:
            rc = ClusterClient(
                startup_nodes=nodes,
                **{**producer_options(), **options},
                retry=Retry(NoBackoff(), 0),
            )
        except redis.AuthenticationError as exc:
            raise AuthenticationFailed(
                f"Redis Cluster at {mask_url(url)} refused the credentials: {exc}"
            ) from None
        except (RedisClusterException, redis.ConnectionError, OSError) as exc:
            _close_nodes(nodes)
            if refused_credentials(exc):
                raise AuthenticationFailed(
                    f"Redis Cluster at {mask_url(url)} refused the credentials: {exc.__cause__}"
                ) from None
            if "cluster mode is not enabled" in str(exc).lower():
                raise _not_a_cluster(url, nodes[0], options) from None
            if attempt == attempts:
                raise ConnectionFailed(
                    f"cannot connect to Redis Cluster at {mask_url(url)}: {exc}"
                ) from None
            log.warning(
                "cannot connect to Redis Cluster at %s (attempt %d of %d): %s; retrying in %.1fs",
                mask_url(url), attempt, attempts, exc, delay,
            )  # fmt: skip
            time.sleep(delay)
            delay *= 2
            continue
        try:
            return rc, load_everywhere(rc)
        except redis.AuthenticationError as exc:  # a primary with other credentials
            rc.close()
            raise AuthenticationFailed(
                f"Redis Cluster at {mask_url(url)} refused the credentials: {exc}"
            ) from None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            rc.close()  # a primary in the slot map that does not answer (down, not failed over)
            if attempt == attempts:
                raise ConnectionFailed(
                    f"cannot connect to Redis Cluster at {mask_url(url)}: a primary does not "
                    f"answer: {exc}"
                ) from None
            log.warning(
                "cannot connect to Redis Cluster at %s (attempt %d of %d): a primary does not "
                "answer: %s; retrying in %.1fs", mask_url(url), attempt, attempts, exc, delay,
            )  # fmt: skip
            time.sleep(delay)
            delay *= 2
        except BaseException:
            rc.close()
            raise
    raise AssertionError("unreachable")


def refused_credentials(exc: BaseException) -> bool:
    """Whether a failed connect to a cluster is its nodes refusing the credentials: redis-py
    raises a RedisClusterException ("cannot be connected") caused by the AuthenticationError."""
    return isinstance(exc.__cause__, redis.AuthenticationError)


def _close_nodes(nodes: list[ClusterNode]) -> None:
    """Close what a failed RedisCluster() left connected (its startup nodes' clients)."""
    for node in nodes:
        if node.redis_connection is not None:
            node.redis_connection.close()
            node.redis_connection = None


def _not_a_cluster(url: str, node: ClusterNode, options: dict[str, Any]) -> Exception:
    """Why redis-py found no slot map at `node`: a server not in cluster mode (ConfigError),
    or a user who may not read it (AuthenticationFailed naming the ACL the README gives)."""
    from .connection import mask_url

    probe = redis.Redis(host=node.host, port=node.port, **{**producer_options(), **options})
    try:
        enabled = probe.info("cluster").get("cluster_enabled") == 1
    except redis.RedisError:
        enabled = True  # INFO refused as well: a user without the commands it needs
    finally:
        probe.close()
    if not enabled:
        return ConfigError(
            f"{mask_url(url)}: the server is not in cluster mode; use a redis:// URL"
        )
    return AuthenticationFailed(
        f"Redis Cluster at {mask_url(url)}: the user may not read the slot map (CLUSTER SLOTS);"
        " grant it `+cluster|slots +command +asking` on every node (README, Redis Cluster)"
    )


def load_everywhere(rc: RedisCluster) -> str:
    """The version handshake on every primary that answers; the newest version in use.

    A primary that does not answer (killed or frozen, not failed over yet) is passed over
    with a WARNING naming it: the queues of the other primaries work, and a call of its own
    queues fails on its own (redis-py's ConnectionError or TimeoutError, after
    SOCKET_TIMEOUT at most) until the cluster answers for its slots again. The error of the
    last primary when none answers."""
    versions = []
    unanswered: list[str] = []
    primaries = rc.get_primaries()
    for node in primaries:
        try:
            versions.append(ensure_loaded(rc.get_redis_connection(node)))
        except redis.AuthenticationError:  # a primary with other credentials
            raise
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            unanswered.append(f"{node.host}:{node.port} ({exc})")
            if isinstance(rc, ClusterClient):  # checked before its first library call
                rc.unchecked.add(node.name)
            if len(unanswered) == len(primaries):  # none answers: connect_cluster retries
                raise
    if unanswered:
        log.warning(passed_over(unanswered))
    return max(versions, key=parse_version)


class ClusterCall:
    """Client.fastcall on a cluster: one FCALL routed by its first key (RedisCluster follows
    MOVED and ASK; see connect_cluster for what is never retried)."""

    def __init__(self, rc: RedisCluster) -> None:
        self._rc = rc

    def __call__(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return self._rc.execute_command("FCALL", name, len(keys), *keys, *args)


def loop_cluster_client(url: str, timeout: float = defaults.LOOP_REDIS_TIMEOUT) -> ClusterClient:
    """A ClusterClient for the scheduling loop and its threads (connection.loop_client on a
    cluster URL): every call gives up after `timeout` seconds and nothing is retried by
    redis-py (the caller backs off). It reads the slot map at once: redis.ConnectionError
    (an outage to retry, as for a single server) when no node answers."""
    from .connection import mask_url

    nodes, options = parse_cluster_url(url)
    try:
        rc = ClusterClient(
            startup_nodes=nodes,
            **{**_loop_options(timeout), **options},
            retry=Retry(NoBackoff(), 0),
        )
        rc.slot_wait = 0.0  # the loop backs off on its own, never waiting inside a call
        rc.reloads_library = False  # the loop reloads it on its own (runtime/rounds.py)
        return rc
    except redis.ConnectionError:  # refused credentials too: an outage for the loop
        raise
    except (RedisClusterException, OSError) as exc:
        raise redis.ConnectionError(f"Redis Cluster at {mask_url(url)}: {exc}") from None


def node_client(
    url: str, host: str, port: int, timeout: float = defaults.LOOP_REDIS_TIMEOUT
) -> redis.Redis:
    """A plain redis.Redis to one node of the cluster of `url` (its credentials and TLS), for
    the loop's raw connections: the round pipe and the sharded subscriptions of that node."""
    _, options = parse_cluster_url(url)
    return redis.Redis(
        host=host,
        port=port,
        **{**_loop_options(timeout), **options},
        retry=Retry(NoBackoff(), 0),
    )


def _loop_options(timeout: float) -> dict[str, Any]:
    """The loop's connection options; the URL's own (`?socket_timeout=`...) win over them,
    as redis-py's from_url lets a single server's URL win."""
    return {"socket_connect_timeout": timeout, "socket_timeout": timeout, "socket_keepalive": True}


def primaries(rc: RedisCluster) -> list[tuple[str, int]]:
    """(host, port) of every primary, as the client's slot map has them."""
    return sorted((node.host, int(node.port)) for node in rc.get_primaries())


def slot_owner(rc: RedisCluster, key: str) -> tuple[str, int]:
    """(host, port) of the primary serving `key`'s slot, as the client's slot map has it."""
    node = rc.nodes_manager.get_node_from_slot(rc.keyslot(key))
    return node.host, int(node.port)


def refresh(rc: RedisCluster) -> None:
    """Read the slot map again (after MOVED, a failover, a lost node): redis.ConnectionError
    when no node answers."""
    try:
        rc.nodes_manager.initialize()
    except (RedisClusterException, OSError) as exc:
        raise redis.ConnectionError(f"cannot read the cluster's slot map: {exc}") from None
