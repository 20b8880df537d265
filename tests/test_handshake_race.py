"""The version handshake racing another client's load: the library is missing when the
probe asks for its marker (queasy_library), and ours is loaded by another client (one that
found it gone after FUNCTION FLUSH, as the chaos test does) before the probe asks for
queasy_version. The probe asks for the marker again rather than call ours foreign (it did:
VersionMismatch "its queasy_version returned '4.0.0'", seen in tests/test_chaos.py)."""

from __future__ import annotations

from typing import Any

import redis

from queasy_py.store.library import bundled_version, ensure_loaded, probe


def answer(conn: redis.Redis, step: tuple[str, tuple[Any, ...]]) -> tuple[bool, Any]:
    """One step of the handshake run on the server, as run_handshake does."""
    method, args = step
    try:
        return True, getattr(conn, method)(*args)
    except redis.ResponseError as exc:
        return False, exc


def test_a_library_loaded_between_the_probes_calls_is_ours(
    raw: redis.Redis, redis_url: str
) -> None:
    ensure_loaded(raw)
    raw.function_delete("queasy")
    steps = probe()
    first = next(steps)
    assert first == ("fcall_ro", ("queasy_library", 0))
    reply = answer(raw, first)
    assert not reply[0]  # missing
    with redis.Redis.from_url(redis_url) as other:  # another client loads it meanwhile
        assert ensure_loaded(other) == bundled_version()
    step = steps.send(reply)
    while True:  # queasy_version answers the version of a library with the marker
        try:
            step = steps.send(answer(raw, step))
        except StopIteration as stop:
            assert stop.value == bundled_version()
            return
