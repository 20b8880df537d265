"""Bounded producer input (issue #18): every time that enters is finite and within 1970 ..
year 9999, data nesting is bounded, configured durations are bounded; anything else is an
InvalidInput (or exit CONFIG) naming the argument, and nothing is written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from lua_calls import live, snapshot

from queasy_py import Client, InvalidInput, Queue
from queasy_py.aio import AsyncClient
from queasy_py.cli import exitcodes
from queasy_py.validate import MAX_DEPTH, MAX_RUN_AT

ROOT = Path(__file__).resolve().parent.parent
QUEASY = str(Path(sys.executable).with_name("queasy"))
ACT = "tests.runtime_handlers.act"


@pytest.fixture
def client(redis_url: str, prefix: str) -> Iterator[Client]:
    with Client(redis_url, workers=0, prefix=prefix) as c:
        yield c


@pytest.fixture
def q(client: Client) -> Queue:
    return client.queue("bounded")


@pytest.fixture
def nothing_written(r: redis.Redis, prefix: str) -> Iterator[None]:
    yield
    assert snapshot(r, prefix) == {}


def rejects(match: str) -> Any:
    return pytest.raises(InvalidInput, match=re.escape(match))


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


# ---------------------------------------------------------------- run_at and delay


@pytest.mark.parametrize(
    "when, message",
    [
        ({"run_at": 1e17}, "run_at must be within 0..253402300799 epoch seconds"),
        ({"run_at": 1e306}, "run_at must be within 0..253402300799 epoch seconds"),
        ({"run_at": 10**400}, "run_at must be within 0..253402300799 epoch seconds"),
        ({"run_at": float("inf")}, "run_at must be within 0..253402300799"),
        (
            {"run_at": MAX_RUN_AT + 1},
            "run_at must be within 0..253402300799 epoch seconds (1970 to the end of "
            "year 9999), got 253402300800",
        ),
        ({"run_at": -1}, "run_at must be within 0..253402300799"),
        (
            {"run_at": datetime(1969, 12, 31, tzinfo=UTC)},
            "run_at must be within 0..253402300799",
        ),
        (
            {"run_at": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5)))},
            "run_at must be within 0..253402300799",
        ),
        ({"delay": 1e30}, "delay must be at most"),
        ({"delay": float("inf")}, "delay must be at most"),
        ({"delay": 10**400}, "delay must be at most"),
        ({"delay": MAX_RUN_AT}, "delay must be at most"),
        ({"delay": float("nan")}, "delay must be a number of seconds, not nan"),
    ],
    ids=[
        "run_at_1e17",
        "run_at_1e306",
        "run_at_huge_int",
        "run_at_inf",
        "run_at_after_9999",
        "run_at_negative",
        "datetime_before_1970",
        "datetime_after_9999",
        "delay_1e30",
        "delay_inf",
        "delay_huge_int",
        "delay_past_9999",
        "delay_nan",
    ],
)
def test_times_out_of_range_are_rejected(
    q: Queue, nothing_written: None, when: dict[str, Any], message: str
) -> None:
    with rejects(message):
        q.dispatch({}, **when)
    with rejects(f"jobs[1]: {message}"):
        q.dispatch_many([{"data": 1}, {"data": 2, **when}])


def test_the_bounds_themselves_are_accepted(q: Queue) -> None:
    q.dispatch({}, id="epoch", run_at=0)
    q.dispatch({}, id="last", run_at=MAX_RUN_AT)
    q.dispatch({}, id="dt", run_at=datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC))
    q.dispatch({}, id="far", delay=MAX_RUN_AT - time.time() - 60)
    assert q.get_job("epoch").run_at == 0  # type: ignore[union-attr]
    assert q.get_job("last").run_at == MAX_RUN_AT  # type: ignore[union-attr]
    assert q.get_job("dt").run_at == MAX_RUN_AT  # type: ignore[union-attr]
    assert live(q.counts()) == {"waiting": 1, "delayed": 3, "blocked": 0, "active": 0}


def test_the_async_client_bounds_times_too(redis_url: str, prefix: str) -> None:
    async def main() -> None:
        async with AsyncClient(redis_url, prefix=prefix) as client:
            with rejects("run_at must be within 0..253402300799"):
                await client.queue("bounded").dispatch({}, run_at=1e306)

    import asyncio

    asyncio.run(main())


def test_queasy_dispatch_with_a_huge_delay_exits_config(
    redis_url: str, prefix: str, nothing_written: None
) -> None:
    done = subprocess.run(
        [QUEASY, "dispatch", "bounded", "{}", "--delay", "1e30"]
        + ["--redis", redis_url, "--prefix", prefix],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == exitcodes.CONFIG, done.stderr
    assert "delay must be at most" in done.stderr
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------- nesting


def test_data_nested_5000_deep_is_invalid_input(q: Queue, nothing_written: None) -> None:
    with rejects(f"job data is nested deeper than {MAX_DEPTH} levels"):
        q.dispatch(nested(5000))
    with rejects(f"job data is nested deeper than {MAX_DEPTH} levels"):
        q.dispatch({"a": nested(MAX_DEPTH)})


def test_data_that_contains_itself_is_invalid_input(q: Queue, nothing_written: None) -> None:
    loop: list = []
    loop.append(loop)
    with rejects("nested deeper than"):
        q.dispatch(loop)


def test_data_nested_to_the_limit_is_accepted(q: Queue) -> None:
    job_id = q.dispatch(nested(MAX_DEPTH))
    assert q.get_job(job_id).data == nested(MAX_DEPTH)  # type: ignore[union-attr]


# ---------------------------------------------------------------- configured durations


@pytest.mark.parametrize(
    "option, value",
    [
        ("timeout", 1e10),
        ("timeout", 10**400),
        ("min_backoff", 1e300),
        ("max_backoff", 2e9),
    ],
)
def test_listen_durations_are_bounded(q: Queue, option: str, value: Any) -> None:
    with rejects(f"{option} must be at most 1e+09 seconds"):
        q.listen(ACT, **{option: value})


def test_fail_option_durations_are_bounded(q: Queue) -> None:
    with rejects("max_backoff must be at most 1e+09 seconds"):
        q.listen(ACT, fail_handler=ACT, fail_options={"max_backoff": 1e12})


@pytest.mark.parametrize("setting", ["heartbeat_interval", "shutdown_timeout", "poll_interval"])
def test_supervisor_durations_are_bounded(redis_url: str, setting: str) -> None:
    with rejects(f"{setting} must be at most 1e+09 seconds"):
        Client(redis_url, **{setting: 1e300})


def test_a_config_with_a_huge_interval_exits_config(tmp_path: Path, redis_url: str) -> None:
    config = tmp_path / "queasy.toml"
    config.write_text(
        f'redis = "{redis_url}"\nheartbeat_interval = 1e300\n[queues.q]\nhandler = "{ACT}"\n'
    )
    done = subprocess.run(
        [QUEASY, "run", str(config)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == exitcodes.CONFIG, done.stderr
    assert "heartbeat_interval: heartbeat_interval must be at most 1e+09 seconds" in done.stderr
