"""The chaos run's own connections to the queue server: a redis.Redis, or on a Redis Cluster
URL (`redis+cluster://`) a redis-py RedisCluster with the same options (each key routed to
its slot's primary)."""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import RedisCluster

from queasy_py.store.cluster import is_cluster_url
from queasy_py.store.clusterurl import parse_cluster_url


def open_redis(url: str, **options: Any) -> Any:
    if is_cluster_url(url):
        nodes, from_url = parse_cluster_url(url)
        return RedisCluster(startup_nodes=nodes, **from_url, **options)
    return redis.Redis.from_url(url, **options)
