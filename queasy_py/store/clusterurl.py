"""A Redis Cluster URL (`redis+cluster://[user:password@]host:port[,host:port...][?options]`)
parsed into its startup nodes and connection options, for the sync and async cluster clients."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import redis
from redis.cluster import ClusterNode

from ..errors import ConfigError
from .connection import CLUSTER_SCHEMES, mask_url


def parse_cluster_url(url: str) -> tuple[list[ClusterNode], dict[str, Any]]:
    """The startup nodes and the connection options of a cluster URL; ConfigError naming
    the masked URL when it lacks a node or a port."""

    scheme, _, rest = url.partition("://")
    base = CLUSTER_SCHEMES.get(scheme.lower())
    if base is None:
        raise ConfigError(f"not a cluster URL: {mask_url(url)}")
    credentials, at, hosts = rest.rpartition("@")
    hosts, _, query = hosts.partition("?")
    hosts = hosts.rstrip("/")
    nodes: list[ClusterNode] = []
    for part in hosts.split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon or not host or not port.isdigit():
            raise ConfigError(
                f"invalid cluster URL {mask_url(url)}: each node must be host:port, "
                "e.g. redis+cluster://10.0.0.1:7000,10.0.0.2:7000"
            )
        nodes.append(ClusterNode(host.strip("[]"), int(port)))
    options: dict[str, Any] = {}
    if at:
        user, colon, password = credentials.partition(":")
        if colon:
            options["password"] = unquote(password)
            if user:
                options["username"] = unquote(user)
        else:
            options["password"] = unquote(user)
    if base == "rediss":
        options["ssl"] = True
        options["ssl_check_hostname"] = True
    if query:
        options.update(_query_options(url, base, query))
    return nodes, options


def _query_options(url: str, base: str, query: str) -> dict[str, Any]:
    """The options of a cluster URL's query, read as redis-py's from_url reads a single
    server's (numbers and bools converted); ConfigError naming the masked URL for a value
    that does not convert or an option redis-py's connections do not take (RedisCluster
    would drop it unsaid)."""
    from redis.connection import parse_url

    from .connection import _SECRET_KEY, mask_url

    try:
        options = parse_url(f"{base}://localhost/?{query}")
    except ValueError as exc:
        raise ConfigError(f"invalid cluster URL {mask_url(url)}: {exc}") from None
    connection_class = options.pop("connection_class", redis.Connection)
    options.pop("host", None)
    try:
        connection_class(**options)  # makes a connection object: opens nothing
    except (TypeError, ValueError, redis.RedisError) as exc:
        why = str(exc).partition("__init__() ")[2] or str(exc)
        if any(str(v) in why for k, v in options.items() if v and _SECRET_KEY.search(k)):
            why = f"{type(exc).__name__}; the details are not shown as they quote a password"
        raise ConfigError(f"invalid cluster URL {mask_url(url)}: {why}") from None
    return options
