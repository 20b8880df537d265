"""Shared fixtures: one real server per session, a clean key prefix per test.

Set QUEASY_TEST_REDIS_URL to run the suite against an existing server instead of an embedded one.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
import redis

from queasy_py.store.embedded import EmbeddedServer

if TYPE_CHECKING:
    from lua_calls import Lua

    from queasy_py import Queue


@dataclass
class ExternalServer:
    """Stands in for EmbeddedServer when the tests use a server they did not start."""

    url: str
    pid: int | None = None


# --- server -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def server() -> Iterator[Any]:
    """The session's server: an EmbeddedServer, or an ExternalServer from QUEASY_TEST_REDIS_URL."""
    external = os.environ.get("QUEASY_TEST_REDIS_URL")
    if external:
        yield ExternalServer(url=external)
        return
    embedded = EmbeddedServer().start()
    try:
        yield embedded
    finally:
        embedded.stop()


@pytest.fixture(scope="module")
def own_server() -> Iterator[EmbeddedServer]:
    """An embedded server of the test module alone, for tests that flush the whole server or
    load another version of the library (the server cost counts, the upgrade from 3.x)."""
    server = EmbeddedServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cluster() -> Iterator[Any]:
    """A real local Redis Cluster of 3 primaries, no replica, with a node timeout of a
    minute: a primary killed or frozen in a test stays down, never failed over (and the
    cluster does not stop serving every slot) while the test runs."""
    from cluster_servers import LocalCluster

    made = LocalCluster(primaries=3, node_timeout=60_000).start()
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[Any]:
    """A real local Redis Cluster of 3 primaries (tests/cluster_servers.py), started on first
    use."""
    from cluster_servers import LocalCluster

    cluster = LocalCluster(primaries=3).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_url(server: Any) -> str:
    return str(server.url)


# --- per-test namespace and connections -------------------------------------------------------


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A key prefix unique to this test; keys matching `<prefix>:*` are deleted afterwards."""
    value = f"qt-{uuid.uuid4().hex[:8]}"
    yield value
    with redis.Redis.from_url(redis_url) as conn:
        batch: list[bytes] = []
        for key in conn.scan_iter(match=f"{value}:*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                conn.unlink(*batch)
                batch.clear()
        if batch:
            conn.unlink(*batch)


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    """A decode_responses=True connection to the test server, closed at teardown."""
    conn = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A bytes connection like Client's; the bundled library is restored afterwards."""
    from queasy_py.store.library import source

    conn = redis.Redis.from_url(redis_url)
    try:
        yield conn
    finally:
        conn.function_load(source(), replace=True)
        conn.close()


# --- the library's functions, and a queue of the public API, on the per-test prefix ------------


@pytest.fixture
def lua(r: redis.Redis, redis_url: str, prefix: str) -> Lua:
    """Raw FCALLs of the library (tests/lua_calls.py) on `prefix`, the bundled library loaded."""
    from lua_calls import Lua

    from queasy_py.store.library import ensure_loaded

    with redis.Redis.from_url(redis_url) as conn:
        ensure_loaded(conn)
    return Lua(r, prefix)


@pytest.fixture
def q(redis_url: str, prefix: str) -> Iterator[Queue]:
    """Queue 'q' of a Client without workers on `prefix`, closed at teardown."""
    from queasy_py import Client

    with Client(redis_url, workers=0, prefix=prefix) as client:
        yield client.queue("q")


@pytest.fixture
def rt(request: Any, redis_url: str, prefix: str, r: redis.Redis, tmp_path: Any) -> Iterator[Any]:
    """A test's `Runtime` (tests/runtime_helpers.py): real supervisors on the embedded server,
    or, with ON_CLUSTER's param 'cluster', on the local Redis Cluster. A module that needs
    another kind defines its own `rt`."""
    from runtime_helpers import runtime

    with runtime(request, redis_url, prefix, r, tmp_path) as made:
        yield made
