"""benchmarks/spark_sink.py empties the server between its modes and waits until the previous
mode's keys are freed: on valkey 8 a FLUSHALL returns at once and a thread of the server frees
the keys while the next mode runs, which counted 2-3 µs per job freed in the next mode's server
CPU (RESULTS.md, "Spark sink: where a sink row's server time went"); without the wait the test
finds all 300,000 keys still pending. A server of this module's own: the test flushes it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.spark_sink import fresh
from queasy_py import Client
from queasy_py.store.embedded import EmbeddedServer

KEYS = 300_000
#: one call fills the server: KEYS small hashes, as many objects for the flush to free
FILL = "for i = 1, tonumber(ARGV[1]) do redis.call('HSET', 'k' .. i, 'f', i) end"


@pytest.fixture
def client(own_server: EmbeddedServer) -> Iterator[Client]:
    with Client(own_server.url, workers=0, prefix="bench") as c:
        yield c


def pending_after_fresh(client: Client, lazy: bool) -> int:
    r = client.redis
    r.execute_command("FLUSHALL", "SYNC")
    r.eval(FILL, 0, KEYS)
    assert r.dbsize() == KEYS
    fresh(client, lazy)
    return int(r.info("memory")["lazyfree_pending_objects"])


def test_fresh_returns_once_the_server_freed_every_key(client: Client) -> None:
    assert pending_after_fresh(client, lazy=False) == 0
    assert client.redis.dbsize() == 0
    assert client.redis.fcall_ro("queasy_library", 0)  # the library loaded again
