"""Bad input gets a clear error naming what is wrong, and nothing is written."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Any

import pytest
import redis
from lua_calls import snapshot

from queasy_py import Client, ConfigError, ConnectionFailed, InvalidInput, Queue
from queasy_py.store.embedded import free_port


class NoOffset(tzinfo):
    """A tzinfo that knows no offset: a datetime with it is naive (datetime's docs)."""

    def utcoffset(self, dt: datetime | None) -> None:
        return None


@dataclass
class Point:
    x: int
    y: int


@pytest.fixture
def client(redis_url: str, prefix: str) -> Iterator[Client]:
    with Client(redis_url, prefix=prefix, max_payload=1000) as c:
        yield c


@pytest.fixture
def q(client: Client) -> Queue:
    return client.queue("emails")


@pytest.fixture
def nothing_written(r: redis.Redis, prefix: str) -> Iterator[None]:
    """Asserts after the test that no key exists under the test's prefix."""
    yield
    assert snapshot(r, prefix) == {}


@pytest.fixture
def unchanged(r: redis.Redis, prefix: str, q: Queue) -> Iterator[str]:
    """A job 'a' that exists before the test; asserts afterwards that no key changed."""
    q.dispatch({"v": 1}, id="a")
    before = snapshot(r, prefix)
    yield "a"
    assert snapshot(r, prefix) == before


def rejects(match: str, error: type[Exception] = InvalidInput) -> Any:
    return pytest.raises(error, match=re.escape(match))


# ---------------------------------------------------------------- data


@pytest.mark.parametrize(
    "data, message",
    [
        (object(), "job data at $ is a object"),
        ({1, 2}, "job data at $ is a set"),
        (b"bytes", "job data at $ is a bytes"),
        (float("nan"), "job data at $ is nan"),
        (float("inf"), "job data at $ is inf"),
        ({"a": [float("-inf")]}, "job data at $.a[0] is -inf"),
        ({1: "one"}, "job data at $ has a non-str key 1"),
        (Point(1, 2), "job data at $ is a Point"),
        ({"when": datetime(2030, 1, 1, tzinfo=UTC)}, "job data at $.when is a datetime"),
        (2**64, "job data"),
        ("\ud800", "job data"),
    ],
    ids=[
        "object",
        "set",
        "bytes",
        "nan",
        "inf",
        "nested_inf",
        "int_key",
        "dataclass",
        "datetime_inside",
        "int_over_64_bits",
        "lone_surrogate",
    ],
)
def test_non_json_data_is_rejected(
    q: Queue, nothing_written: None, data: Any, message: str
) -> None:
    with rejects(message):
        q.dispatch(data)


def test_data_over_the_payload_limit_is_rejected(q: Queue, nothing_written: None) -> None:
    with rejects("1002 bytes encoded, over the limit of 1000 bytes"):
        q.dispatch("x" * 1000)


def test_data_at_the_payload_limit_is_accepted(q: Queue) -> None:
    q.dispatch("x" * 998)  # 1000 bytes with its quotes
    assert q.counts()["waiting"] == 1


def test_an_update_with_bad_data_leaves_the_job_unchanged(q: Queue, unchanged: str) -> None:
    with rejects("job data at $ is a set"):
        q.dispatch({1}, id=unchanged)


# ---------------------------------------------------------------- names and ids


@pytest.mark.parametrize(
    "name",
    ["", "a" * 101, "a{b}", "a b", None],
    ids=["empty", "101_chars", "braces", "space", "none"],
)
def test_invalid_queue_name_is_rejected(client: Client, nothing_written: None, name: Any) -> None:
    with rejects(f"invalid queue name {name!r}"):
        client.queue(name)


def test_a_huge_queue_name_is_not_echoed_whole(client: Client) -> None:
    """A 100 000-character name was quoted whole in the error (and in the one line `queasy
    jobs` logs): it is cut, with its length."""
    with pytest.raises(InvalidInput) as info:
        client.queue("x" * 100_000)
    assert len(str(info.value)) < 200
    assert "(100002 characters): use 1-100 characters" in str(info.value)


def test_queue_name_of_100_chars_is_accepted(client: Client) -> None:
    assert client.queue("a" * 100).name == "a" * 100


@pytest.mark.parametrize(
    "job_id, message",
    [
        ("", "job id must be 1-256 characters, got 0"),
        ("a" * 257, "job id must be 1-256 characters, got 257"),
        ("a b", "job id 'a b' contains whitespace or control characters"),
        ("a\nb", "job id 'a\\nb' contains whitespace or control characters"),
        ("a\x00b", "contains whitespace or control characters"),
        (42, "job id must be a str, not int"),
    ],
    ids=["empty", "257_chars", "space", "newline", "nul", "int"],
)
def test_invalid_job_id_is_rejected(
    q: Queue, nothing_written: None, job_id: Any, message: str
) -> None:
    with rejects(message):
        q.dispatch("x", id=job_id)


@pytest.mark.parametrize("method", ["cancel", "get_job"])
def test_invalid_job_id_is_rejected_by_cancel_and_get_job(
    q: Queue, nothing_written: None, method: str
) -> None:
    with rejects("contains whitespace"):
        getattr(q, method)("a b")


def test_job_id_of_256_chars_is_accepted(q: Queue) -> None:
    assert q.dispatch("x", id="a" * 256) == "a" * 256


def test_key_prefix_with_braces_is_rejected(redis_url: str) -> None:
    with rejects("invalid key prefix 'a{b}'"):
        Client(redis_url, prefix="a{b}")


@pytest.mark.parametrize("limit", ["1000", 0, -1, True, 1.5, None])
def test_a_bad_max_payload_is_refused_when_the_client_is_made(redis_url: str, limit) -> None:
    """It was taken as given: "1000" made every dispatch a TypeError ('>' not supported
    between 'int' and 'str'), 0 or -1 refused every job as over the limit."""
    import asyncio

    from queasy_py.aio import AsyncClient

    with rejects(f"max_payload must be an int >= 1 (bytes), not {limit!r}"):
        Client(redis_url, max_payload=limit)
    with rejects(f"max_payload must be an int >= 1 (bytes), not {limit!r}"):
        asyncio.run(AsyncClient(redis_url, max_payload=limit).close())


# ---------------------------------------------------------------- time and flags


@pytest.mark.parametrize(
    "when, message",
    [
        ({"run_at": time.time() + 60, "delay": 60}, "give run_at or delay, not both"),
        ({"delay": -1}, "delay must be >= 0 seconds, got -1"),
        ({"delay": "soon"}, "delay must be a number of seconds, not 'soon'"),
        ({"run_at": datetime(2030, 1, 1)}, "run_at is a naive datetime"),
        ({"run_at": "tomorrow"}, "run_at must be an aware datetime or epoch seconds"),
        ({"run_at": float("nan")}, "run_at must be an aware datetime or epoch seconds"),
        # a tzinfo whose utcoffset() is None: naive, as Python defines it (a TypeError before)
        ({"run_at": datetime(2030, 1, 1, tzinfo=NoOffset())}, "run_at is a naive datetime"),
    ],
    ids=[
        "both",
        "negative_delay",
        "delay_str",
        "naive_datetime",
        "run_at_str",
        "run_at_nan",
        "tzinfo_without_offset",
    ],
)
def test_bad_run_at_or_delay_is_rejected(
    q: Queue, nothing_written: None, when: dict[str, Any], message: str
) -> None:
    with rejects(message):
        q.dispatch("x", **when)


@pytest.mark.parametrize("mode", ["sometimes", 1, None])
def test_unknown_update_run_at_is_rejected(q: Queue, unchanged: str, mode: Any) -> None:
    with rejects(f"update_run_at must be True, False, 'if_later' or 'if_earlier', not {mode!r}"):
        q.dispatch({"v": 2}, id=unchanged, update_run_at=mode)


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"update_data": "yes"}, "update_data must be True or False, not 'yes'"),
        ({"reset_counts": 0}, "reset_counts must be True, False or None, not 0"),
    ],
    ids=["update_data", "reset_counts"],
)
def test_non_bool_update_flags_are_rejected(
    q: Queue, unchanged: str, flags: dict[str, Any], message: str
) -> None:
    with rejects(message):
        q.dispatch({"v": 2}, id=unchanged, **flags)


# ---------------------------------------------------------------- dispatch_many


def five_jobs_third_is(bad: dict[str, Any]) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = [{"data": n, "id": f"j{n}"} for n in range(5)]
    jobs[2] = bad
    return jobs


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"data": {1, 2}}, "jobs[2]: job data at $ is a set"),
        ({"data": 2, "id": "a b"}, "jobs[2]: job id 'a b' contains whitespace"),
        ({"data": 2, "run_at": 1.0, "delay": 1}, "jobs[2]: give run_at or delay, not both"),
        ({"id": "j2"}, "jobs[2] must be a mapping with a 'data' key"),
        ({"data": 2, "priority": 1}, "jobs[2] has unknown keys ['priority']"),
        ("j2", "jobs[2] must be a mapping with a 'data' key"),
    ],
    ids=["data", "id", "run_at_and_delay", "no_data", "unknown_key", "not_a_mapping"],
)
def test_dispatch_many_with_one_bad_job_writes_none(
    q: Queue, nothing_written: None, bad: Any, message: str
) -> None:
    with rejects(message):
        q.dispatch_many(five_jobs_third_is(bad))


@pytest.mark.parametrize(
    "jobs", [None, {"data": 1}, "abc", 5], ids=["none", "one_job", "str", "int"]
)
@pytest.mark.parametrize("method", ["dispatch_many", "dispatch_batch"])
def test_jobs_that_are_not_a_list_of_jobs_are_named(
    q: Queue, nothing_written: None, method: str, jobs: Any
) -> None:
    """None or an int was a TypeError ('NoneType' object is not iterable); one job's dict,
    given where a list of them is expected, was read as its keys ('jobs[0] must be a
    mapping')."""
    with rejects("jobs must be a list (an iterable) of job mappings"):
        getattr(q, method)(jobs)


# ---------------------------------------------------------------- connection


def test_unreachable_server_fails_naming_the_url_within_bounded_time() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    with rejects(f"cannot connect to Redis at {url}", ConnectionFailed):
        Client(url).ready()  # the first call connects
    assert time.monotonic() - started < 15


def test_connection_error_masks_the_password() -> None:
    url = f"redis://user:s3cret-pw@127.0.0.1:{free_port()}/0"
    with pytest.raises(ConnectionFailed) as caught, Client(url):
        pass
    message = str(caught.value)
    assert "user:***@127.0.0.1" in message
    assert "s3cret-pw" not in message


@pytest.mark.parametrize(
    "host",
    ["bad!host:1", "my host:1", "h\u00f6st.invalid:1", "[::1", "h*:1", "[::1]x:1"],
    ids=["bang", "space", "unicode", "open_bracket", "star", "after_bracket"],
)
def test_a_malformed_host_never_shows_the_password(host: str) -> None:
    """A host that is not a plain name, IPv4 or [IPv6] (a typo) must not make the masking
    give up: the password was in the ConfigError, the ConnectionFailed and repr(client)."""
    url = f"redis://user:s3cret-pw@{host}"
    try:
        client = Client(url, workers=0)
    except ConfigError as exc:  # refused at once
        assert "s3cret-pw" not in str(exc)
        return
    assert "s3cret-pw" not in repr(client)
    with pytest.raises(ConnectionFailed) as caught:
        client.ready(attempts=1)
    assert "s3cret-pw" not in str(caught.value)
    assert "user:***@" in str(caught.value)
