"""Dispatch of jobs already checked and encoded: the Spark sink's hot path.

The sink's column converters make every value JSON on the way (the schema, checked on the
driver, fixes the types), so its rows skip dispatch_batch's per-value checks and come here
as flat triples [id, data (JSON bytes), run_at (ms or ''), ...]; the library still checks
every id, document and run_at of an FCALL (INVALID, nothing of that FCALL written).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .errors import InvalidInput
from .queue_base import BatchResult
from .store.lazyredis import redis
from .store.library import Dispatched, lua_error

if TYPE_CHECKING:
    from .queue import Queue


def dispatch_encoded(
    queue: Queue,
    triples: list,
    update_data: bool = True,
    update_run_at: bool | str = True,
    reset_counts: bool | None = None,
    *,
    dedup_window: float | None = None,
) -> BatchResult:
    """dispatch_batch of jobs already checked and encoded (the Spark sink's, whose types
    the schema fixed on the driver): `triples` is flat, [id, data, run_at, ...], each id
    within the id rules, each data JSON bytes of at most the client's max_payload, each
    run_at epoch ms within the library's bounds or '' (now). The library still checks
    every id, JSON document and run_at (INVALID, nothing written) but the error names
    the job by its position only."""
    if len(triples) % 3:
        raise InvalidInput(f"triples must be id, data, run_at groups, got {len(triples)}")
    window = None if dedup_window is None else queue._window_ms(dedup_window)
    flags = queue._flags(update_data, update_run_at, reset_counts)
    chunks, ids = queue._chunks(flags, triples), triples[0::3]
    queue._check_reserved(ids, chunks)  # as dispatch_batch: no chunk written, or every one
    return queue._send_batch(chunks, ids, window)


def dispatch_encoded_stream(
    queue: Queue,
    batches: Iterable[list],
    update_data: bool = True,
    update_run_at: bool | str = True,
    reset_counts: bool | None = None,
    *,
    dedup_window: float | None = None,
) -> Iterator[BatchResult]:
    """dispatch_encoded of each list of triples of `batches`, one batch ahead: the
    FCALLs of a batch are sent, then the next batch is taken from `batches` (made while
    the server runs the one sent, and sent) before the replies of the first are read.
    Yields one BatchResult per batch, in order. On a cluster, one batch at a time."""
    window = None if dedup_window is None else queue._window_ms(dedup_window)
    flags = queue._flags(update_data, update_run_at, reset_counts)
    pool = getattr(queue.client.redis, "connection_pool", None)
    if pool is None:  # a RedisCluster routes each call itself
        for triples in batches:
            yield dispatch_encoded(
                queue, triples, update_data, update_run_at, reset_counts, dedup_window=dedup_window
            )
        return
    name = "queasy_dispatch" if window is None else "queasy_dispatch_once"
    conn = pool.get_connection()
    in_sync = False  # every reply of what was sent read: the connection can be reused
    try:
        sent: tuple[int, list[str]] | None = None
        for triples in batches:
            if len(triples) % 3:
                raise InvalidInput(f"triples must be id, data, run_at groups, got {len(triples)}")
            chunks, ids = queue._chunks(flags, triples), triples[0::3]
            queue._check_reserved(ids, chunks)  # as dispatch_batch: before any chunk is sent
            if chunks:
                queue._register()  # Client.queues: once, on another connection of the pool
            if window is not None:
                chunks = [[*args[:4], window, *args[5:]] for args in chunks]  # no trace
            conn.send_packed_command(
                conn.pack_commands([("FCALL", name, 1, queue.keys.base, *args) for args in chunks]),
                check_health=False,
            )
            if sent is not None:
                yield _replies(conn, *sent)
            sent = (len(chunks), ids)
        if sent is not None:
            yield _replies(conn, *sent)
        in_sync = True
    finally:
        if not in_sync:
            conn.disconnect()
        pool.release(conn)


def _replies(conn: Any, count: int, ids: list[str]) -> BatchResult:
    """The BatchResult of `count` FCALLs sent on `conn` (a ResponseError leaves the
    connection out of step: its caller drops it)."""
    codes: list[Dispatched] = []
    for _ in range(count):
        try:
            reply = conn.read_response()
        except redis.ResponseError as exc:
            raise lua_error(exc) from None
        codes.extend(Dispatched(int(code)) for code in reply)
    return BatchResult(ids, codes)
