"""The ready-made fail handlers (queasy_py.handlers.reschedule and .dead_letter, source in
handlers/) act only on the queue their fail queue belongs to: a record written straight into a
fail queue that names another queue is refused (PermanentError), and nothing of that queue is
touched."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from runtime_helpers import ACT, Runtime, queue_spec, wait_for

from queasy_py import Job, PermanentError
from queasy_py.handlers import dead_letter
from queasy_py.handlers._fail_record import fail_record
from queasy_py.store.keys import QueueKeys

DEAD_LETTER = "queasy_py.handlers.dead_letter"
ERROR = {"name": "Boom", "message": "failed for good", "kind": "permanent"}


@pytest.fixture
def rt(redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(redis_url, prefix, r, tmp_path) as runtime:
        yield runtime


def victim_keys(r: redis.Redis, prefix: str) -> list[str]:
    return sorted(r.scan_iter(match=f"{prefix}:{{victim}}:*"))


def record(queue: str, job_id: str) -> list:
    job = {"id": job_id, "queue": queue, "run_at": 0, "retry_count": 0}
    return [{"n": 1}, job, ERROR]


@pytest.mark.parametrize(
    "handler", ["queasy_py.handlers.reschedule", "queasy_py.handlers.dead_letter"]
)
def test_a_fail_record_naming_another_queue_is_refused(
    rt: Runtime, r: redis.Redis, prefix: str, handler: str
) -> None:
    q = rt.queue("q")
    rt.start({"q": queue_spec(ACT, fail_handler=handler)})
    # written straight into q's fail queue by anyone who can dispatch: names queue "victim"
    q.fail_queue.dispatch(record("victim", "v1"), id="forged")
    q.fail_queue.dispatch(["not", "a record"], id="garbage")
    q.fail_queue.dispatch(record("q", "j1"), id="genuine")  # the control: acted on
    events = {e["id"]: e for e in rt.wait_events("q-fail", 3, tag="q")}
    assert events["forged"]["outcome"] == "failed"
    assert events["forged"]["error_name"] == "PermanentError"
    assert events["forged"]["error_kind"] == "permanent"  # not retried
    assert events["garbage"]["outcome"] == "failed"
    assert events["garbage"]["error_kind"] == "permanent"
    assert events["genuine"]["outcome"] == "finished"
    assert victim_keys(r, prefix) == []
    assert r.lrange(QueueKeys(prefix, "victim", "victim").dead_letters, 0, -1) == []
    if handler == "queasy_py.handlers.reschedule":
        job = q.get_job("j1")
        assert job is not None and job.state == "delayed"  # re-dispatched into q itself
    else:
        (letter,) = dead_letter.read(q)
        assert letter["job"]["id"] == "j1"


def fail_job(queue: str) -> Job:
    return Job(id="f1", queue=queue, run_at=0.0, retry_count=0, stall_count=0, timeout_count=0)


@pytest.mark.parametrize(
    "data, queue, message",
    [
        (
            record("victim", "v1"),
            "q-fail",
            "names queue 'victim'; the fail handler of q-fail acts on 'q' only",
        ),
        (record("q", "j1"), "q", "'q' is not a fail queue"),
        (record("q", "j1"), "-fail", "'-fail' is not a fail queue"),
        ({"a": 1}, "q-fail", "data is not [data, job, error]"),
        ([1, {"queue": "q"}, {}], "q-fail", "the failed job has no str id"),
    ],
    ids=["other_queue", "not_a_fail_queue", "bare_suffix", "not_a_list", "no_id"],
)
def test_the_refusals_say_why(data: object, queue: str, message: str) -> None:
    with pytest.raises(PermanentError, match=re.escape(message)):
        fail_record(data, fail_job(queue))


@pytest.mark.parametrize(
    ("handler", "env", "value"),
    [
        ("queasy_py.handlers.dead_letter", "QUEASY_DEAD_LETTER_MAX", "0"),  # was: no cap at all
        ("queasy_py.handlers.dead_letter", "QUEASY_DEAD_LETTER_MAX", "-5"),
        ("queasy_py.handlers.dead_letter", "QUEASY_DEAD_LETTER_MAX", "ten"),
        ("queasy_py.handlers.reschedule", "QUEASY_RESCHEDULE_DELAY", "-1"),
        ("queasy_py.handlers.reschedule", "QUEASY_RESCHEDULE_DELAY", "nan"),
        ("queasy_py.handlers.reschedule", "QUEASY_RESCHEDULE_DELAY", "inf"),
        ("queasy_py.handlers.reschedule", "QUEASY_RESCHEDULE_DELAY", "1m"),
    ],
)
def test_a_bad_setting_of_a_ready_made_handler_stops_its_import_naming_it(
    handler: str, env: str, value: str
) -> None:
    """listen() (and each worker) imports the handler: a bad environment setting is a
    HandlerError naming the variable, not a list without a cap or a reschedule that fails
    every time."""
    code = f"from queasy_py.runtime.handler import load; load({handler!r})"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, env: value},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0, done.stdout
    assert "HandlerError" in done.stderr and f"{env} must be" in done.stderr, done.stderr
    assert repr(value) in done.stderr, done.stderr


def test_dead_letters_read_refuses_a_count_that_is_not_positive(
    redis_url: str, prefix: str
) -> None:
    from queasy_py import Client, InvalidInput

    with Client(redis_url, workers=0, prefix=prefix) as client:
        q = client.queue("q")
        for n in range(3):
            client.redis.lpush(q.keys.dead_letters, f'{{"n": {n}}}')
        assert [e["n"] for e in dead_letter.read(q, 2)] == [2, 1]
        for count in (0, -1, True, 1.5):  # was: 0 and -1 read the whole list
            with pytest.raises(InvalidInput, match="count must be an int >= 1"):
                dead_letter.read(q, count)  # type: ignore[arg-type]


def test_dead_letters_read_leaves_out_an_entry_that_is_not_a_letter(
    redis_url: str, prefix: str
) -> None:
    """An entry another hand wrote into the list (not JSON, or JSON but no object): read()
    reads the letters around it, as requeue() leaves it (read() raised JSONDecodeError)."""
    from queasy_py import Client

    with Client(redis_url, workers=0, prefix=prefix) as client:
        q = client.queue("q")
        for raw in ('{"n": 0}', "not json", "[1, 2]", '{"n": 1}'):
            client.redis.lpush(q.keys.dead_letters, raw)
        assert [e["n"] for e in dead_letter.read(q)] == [1, 0]
        assert [e["n"] for e in dead_letter.read(q, 2)] == [1]  # of the newest 2 entries


#: job data nested deeper than orjson writes (it refuses 255 levels), which the library takes
DEEP = b"[" * 300 + b"]" * 300


def test_a_dead_letter_of_data_nested_deeper_than_orjson_writes_is_kept(rt: Runtime) -> None:
    """A job whose data, written around the producer API, is nested 300 levels deep (the
    library takes 1000) fails; its dead letter is written all the same (the fail handler
    raised TypeError on encoding it, and after its retries the letter was lost), and
    requeue() leaves it, as no dispatch takes such data."""
    q = rt.queue("q")
    q.dispatch({"n": 1}, id="deep")
    # what any producer with the keys can do (5.0: the data is the last part of its record)
    nums, trace, _ = rt.r.hget(q.keys.base + ":rec", "deep").split("\t", 2)
    rt.r.hset(q.keys.base + ":rec", "deep", f"{nums}\t{trace}\t{DEEP.decode()}")
    rt.start({"q": queue_spec(ACT, fail_handler=DEAD_LETTER, max_retries=0)})
    (letter,) = wait_for(lambda: dead_letter.read(q), what="the dead letter of job deep")
    assert letter["job"]["id"] == "deep"
    assert letter["data"] == json.loads(DEEP)
    assert dead_letter.requeue(q) == []
    assert len(dead_letter.read(q)) == 1  # it stays
