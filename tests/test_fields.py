"""Numbers read back from Redis go through one tolerant parser (queasy_py/store/fields.py):
exponent form and garbage never raise."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import records
import redis
from lua_calls import live

from queasy_py import Client
from queasy_py.aio import AsyncClient
from queasy_py.store import fields

YEAR_9999 = 253402300799  # the last second of year 9999, the latest run_at accepted


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b"42", 42),
        ("42", 42),
        (42, 42),
        (b"-7", -7),
        (b"1e+20", 10**20),
        (b"2.53402300799e+14", 253402300799000),
        (b"2.9", 2),
        (2.5, 2),
        (b" 3 ", 3),
        (10**30, 10**30),
    ],
)
def test_to_int_accepts_ints_floats_and_exponent_form(raw: Any, expected: int) -> None:
    assert fields.to_int(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [None, b"", b"abc", b"nan", b"inf", b"-inf", b"\xff\xfe", "1" * 1000, True, [1], object()],
)
def test_garbage_gives_the_default_and_never_raises(raw: Any) -> None:
    assert fields.to_int(raw) is None
    assert fields.to_int(raw, -1) == -1
    assert fields.to_float(raw, 0.5) == 0.5
    assert fields.ms_to_seconds(raw, 0.0) == 0.0


def test_to_float_and_ms_to_seconds() -> None:
    assert fields.to_float(b"2.5") == 2.5
    assert fields.to_float(b"1e3") == 1000.0
    assert fields.to_float(float("nan")) is None
    assert fields.to_float(10**400) is None  # too large for a float
    assert fields.ms_to_seconds(b"1500") == 1.5
    assert fields.ms_to_seconds(b"2.53402300799e+14") == YEAR_9999


def test_text_decodes_bytes_and_replaces_bad_utf8() -> None:
    assert fields.text(b"abc") == "abc"
    assert fields.text("abc") == "abc"
    assert fields.text(b"a\xff") == "a\ufffd"
    assert fields.text(None) == ""
    assert fields.text(3, "?") == "?"


# ---------------------------------------------------------------- through the public API


@pytest.fixture
def client(redis_url: str, prefix: str) -> Iterator[Client]:
    with Client(redis_url, workers=0, prefix=prefix) as c:
        yield c


def test_get_job_reads_a_run_at_lua_writes_in_exponent_form(client: Client) -> None:
    q = client.queue("far")
    q.dispatch({"n": 1}, id="late", run_at=YEAR_9999)  # Lua's tostring: '2.53402300799e+14'
    job = q.get_job("late")
    assert job is not None and job.state == "delayed"
    assert job.run_at == YEAR_9999


def test_get_job_survives_a_hand_written_run_at(client: Client, r: redis.Redis) -> None:
    q = client.queue("raw")
    q.dispatch({"n": 1}, id="j", delay=60)
    records.garble(r, q.keys.base, "j", "run_at", "1e+12")  # written straight into Redis
    job = q.get_job("j")
    assert job is not None and job.run_at == 1e9
    records.garble(r, q.keys.base, "j", "run_at", "1e+20")  # out of range: read as 0
    job = q.get_job("j")
    assert job is not None and job.run_at == 0.0
    assert live(q.counts()) == {"waiting": 0, "delayed": 1, "blocked": 0, "active": 0}


def test_the_async_get_job_reads_exponent_form_too(redis_url: str, prefix: str) -> None:
    async def main() -> float:
        async with AsyncClient(redis_url, prefix=prefix) as client:
            q = client.queue("far")
            await q.dispatch({}, id="late", run_at=YEAR_9999)
            job = await q.get_job("late")
            assert job is not None
            return job.run_at

    assert asyncio.run(main()) == YEAR_9999
