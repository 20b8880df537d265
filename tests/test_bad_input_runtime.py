"""Bad input on the running side (issue 4 §3; README "Bad input"): each gets a clear error or
log line, the supervisor keeps running, and no job is lost.

The producer-side rows of the table (non-JSON data, data over the payload limit, bad queue
names and ids, ...) are in tests/test_bad_input.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from runtime_helpers import FAIL_RECORD, ROOT, Runtime, queue_spec, wait_for

from queasy_py import Client, InvalidInput, QueasyError, defaults
from queasy_py.cli import exitcodes
from queasy_py.store.embedded import EmbeddedServer

QUEASY = str(Path(sys.executable).with_name("queasy"))
RUDE = "tests.runtime_handlers.rude"
RUDE_ASYNC = "tests.runtime_handlers.rude_async"
FAST_FAIL = {"min_backoff": 0.05, "max_backoff": 0.1}


@pytest.fixture
def rt(redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(redis_url, prefix, r, tmp_path) as runtime:
        yield runtime


def queasy(*args: str, timeout: float = 60.0) -> tuple[int, str]:
    """Run the `queasy` command; return its exit code and its output (stdout + stderr)."""
    done = subprocess.run(
        [QUEASY, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
        text=True,
    )
    return done.returncode, done.stdout


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "queasy.toml"
    path.write_text(text)
    return str(path)


def valid_config(redis_url: str, prefix: str, handler: str = "tests.runtime_handlers.act") -> str:
    return f'redis = "{redis_url}"\nprefix = "{prefix}"\n[queues.q]\nhandler = "{handler}"\n'


def canary(rt: Runtime, sup_pid: int, queue: str = "q") -> None:
    """A plain job dispatched now still runs on the same supervisor: it kept running."""
    rt.queue(queue).dispatch({"tag": "canary"})
    rt.wait_records(1, "end", tag="canary")
    assert psutil.pid_exists(sup_pid)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ---------------------------------------------------------------- configuration


def test_malformed_toml_exits_config_naming_the_file(tmp_path: Path) -> None:
    path = write_config(tmp_path, '[queues.q]\nhandler = "tests.runtime_handlers.act\n')
    code, out = queasy("run", path)
    assert code == exitcodes.CONFIG == 2
    assert f"malformed TOML in {path}" in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    "text, key",
    [
        ('colour = "blue"\n[queues.q]\nhandler = "tests.runtime_handlers.act"\n', "colour"),
        ('[queues.q]\nhandler = "tests.runtime_handlers.act"\nsise = 3\n', "queues.q.sise"),
        ('[queues.q]\nhandler = "x.y"\n[queues.q.fail_options]\nretries = 3\n', "fail_options"),
    ],
    ids=["top_level", "queue", "fail_options"],
)
def test_an_unknown_config_key_exits_config_naming_the_key(
    tmp_path: Path, text: str, key: str
) -> None:
    code, out = queasy("run", write_config(tmp_path, text))
    assert code == exitcodes.CONFIG
    assert key in out and "unknown" in out
    assert "Traceback" not in out


ACT_QUEUE = '[queues.q]\nhandler = "tests.runtime_handlers.act"\n'


@pytest.mark.parametrize(
    "text, key",
    [
        (ACT_QUEUE + "events_maxlen = 1000000000000\n", "queues.q: events_maxlen"),
        ("heartbeat_interval = 0.0004\n" + ACT_QUEUE, "heartbeat_interval"),
        ("heartbeat_interval = 500000000\n" + ACT_QUEUE, "heartbeat_interval"),
    ],
    ids=["events_maxlen", "heartbeat_interval_tiny", "heartbeat_interval_huge"],
)
def test_a_config_value_the_library_refuses_exits_config_naming_the_key(
    tmp_path: Path, text: str, key: str
) -> None:
    """A value past what lua/queasy.lua accepts (MAX_COUNT) was taken: the supervisor then
    started, its every heartbeat and dequeue refused (INVALID), and never ran a job."""
    code, out = queasy("run", write_config(tmp_path, text))
    assert (code, out.count("\n")) == (exitcodes.CONFIG, 1), out
    assert key in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "heartbeat_interval = 0.05\n" + ACT_QUEUE,
            "heartbeat_interval must be 0.1..499999999 seconds",
        ),
        (
            "max_jobs_per_worker = 0.5\n" + ACT_QUEUE,
            "max_jobs_per_worker must be a whole number of jobs >= 0",
        ),
    ],
    ids=["heartbeat_interval_too_short", "max_jobs_per_worker_fraction"],
)
def test_a_setting_no_supervisor_can_run_with_exits_config_naming_it(
    tmp_path: Path, text: str, message: str
) -> None:
    """heartbeat_interval 0.05 (down to 0.0005 was taken): an expiry of 100 ms or less, so
    a loaded machine's supervisors swept one another's jobs as dead. max_jobs_per_worker 0.5
    was taken: its worker was recycled after every job."""
    code, out = queasy("run", write_config(tmp_path, text))
    assert (code, out.count("\n")) == (exitcodes.CONFIG, 1), out
    assert message in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    "options, message",
    [
        ("size = 500\n", "queues.q: queue 'q', fail_options: size must be an int 1..100, not"),
        ("max_backoff = 5\n", "queues.q: queue 'q', fail_options: min_backoff (10.0) is larger"),
    ],
    ids=["size", "backoffs"],
)
def test_a_bad_fail_options_value_is_named_as_one(
    tmp_path: Path, options: str, message: str
) -> None:
    """A bad value under [queues.q.fail_options] was reported as the queue's own
    (`queues.q: size must be ...`), sending the reader to a key that is fine."""
    text = ACT_QUEUE + 'fail_handler = "tests.runtime_handlers.act"\n[queues.q.fail_options]\n'
    code, out = queasy("run", write_config(tmp_path, text + options))
    assert (code, out.count("\n")) == (exitcodes.CONFIG, 1), out
    assert message in out
    assert "Traceback" not in out


def test_listen_refuses_an_events_maxlen_the_library_refuses() -> None:
    from queasy_py.options import ListenOptions

    with pytest.raises(InvalidInput, match="events_maxlen must be an int 0..999999999999"):
        ListenOptions.build("q", "x.y", {"events_maxlen": 10**12}, check=False)
    ListenOptions.build("q", "x.y", {"events_maxlen": 10**12 - 1}, check=False)


@pytest.mark.parametrize("name", ["a b", "{a}", "a}b"])
def test_a_config_queue_name_with_spaces_or_braces_exits_config(tmp_path: Path, name: str) -> None:
    text = f'[queues."{name}"]\nhandler = "tests.runtime_handlers.act"\n'
    code, out = queasy("run", write_config(tmp_path, text))
    assert code == exitcodes.CONFIG
    assert f"queues.{name}" in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    "handler, message",
    [
        ("tests.runtime_handlers.broken", "failed to import: RuntimeError"),
        ("tests.runtime_handlers.no_handle", "has no callable handle(data, job)"),
        ("tests.runtime_handlers.does_not_exist", "failed to import: ModuleNotFoundError"),
        ("not a module path", "is not a module path"),
        # called, these would run nothing (the job finished without running) or only fail
        ("tests.runtime_handlers.generator", "handle is a generator function"),
        ("tests.runtime_handlers.async_generator", "handle is an async generator function"),
        ("tests.runtime_handlers.wrapped_generator", "handle wraps a generator function"),
        ("tests.runtime_handlers.a_class", "handle is a class"),
        (
            "tests.runtime_handlers.wrong_signature",
            "handle(data: Any) -> None cannot take (data, job)",
        ),
    ],
    ids=[
        "raises_on_import",
        "no_handle",
        "missing",
        "not_a_path",
        "generator",
        "async_generator",
        "wrapped_generator",
        "class",
        "wrong_signature",
    ],
)
def test_a_bad_handler_module_exits_handler_before_any_job_is_taken(
    tmp_path: Path, redis_url: str, prefix: str, handler: str, message: str
) -> None:
    with Client(redis_url, workers=0, prefix=prefix) as producer:
        producer.queue("q").dispatch({"tag": "kept"}, id="kept")
        code, out = queasy("run", write_config(tmp_path, valid_config(redis_url, prefix, handler)))
        assert code == exitcodes.HANDLER == 4
        assert message in out and repr(handler) in out
        assert "Traceback" not in out
        job = producer.queue("q").get_job("kept")
        assert job is not None and job.state == "waiting"  # nothing was taken


# ---------------------------------------------------------------- connection and server


def test_a_wrong_password_exits_connect_with_the_password_masked(
    tmp_path: Path, redis_url: str
) -> None:
    url = redis_url.replace("redis://", "redis://qt-nobody:wrong-pw-123@")
    path = write_config(tmp_path, '[queues.q]\nhandler = "tests.runtime_handlers.act"\n')
    code, out = queasy("run", "--redis", url, path, timeout=30)
    assert code == exitcodes.CONNECT == 3
    assert "refused the credentials" in out
    assert "qt-nobody:***@127.0.0.1" in out
    assert "wrong-pw-123" not in out
    assert "retrying" not in out  # bad credentials are not retried
    assert "Traceback" not in out


@pytest.fixture(scope="module")
def no_functions_server() -> Iterator[EmbeddedServer]:
    """A server that answers FCALL and FUNCTION like Redis 6: `unknown command`."""
    renamed = []
    for command in ("FCALL", "FCALL_RO", "FUNCTION"):
        renamed += ["--rename-command", command, ""]
    server = EmbeddedServer(extra_args=renamed).start()
    try:
        yield server
    finally:
        server.stop()


def test_a_server_without_functions_is_a_clear_error(
    tmp_path: Path, no_functions_server: EmbeddedServer
) -> None:
    with pytest.raises(QueasyError, match=re.escape("needs Redis >= 7.0 or Valkey >= 7.2")):
        Client(no_functions_server.url).ready()
    path = write_config(tmp_path, '[queues.q]\nhandler = "tests.runtime_handlers.act"\n')
    code, out = queasy("run", "--redis", no_functions_server.url, path)
    assert code == exitcodes.VERSION == 5
    assert "has no Redis Functions" in out and "needs Redis >= 7.0" in out
    assert "Traceback" not in out


# ---------------------------------------------------------------- job data


def test_data_over_the_default_payload_limit_is_rejected_and_at_it_runs(rt: Runtime) -> None:
    q = rt.queue("q")
    overhead = len('{"tag":"big","pad":""}')
    with pytest.raises(InvalidInput, match="bytes"):
        q.dispatch({"tag": "big", "pad": "x" * (defaults.MAX_PAYLOAD_BYTES - overhead + 1)})
    assert q.counts()["waiting"] == 0
    q.dispatch({"tag": "big", "pad": "x" * (defaults.MAX_PAYLOAD_BYTES - overhead)}, id="big")
    sup = rt.start({"q": queue_spec()})
    (end,) = rt.wait_records(1, "end", tag="big")
    assert end["id"] == "big"
    canary(rt, sup.pid)


# ---------------------------------------------------------------- handlers


def test_a_handler_returning_a_non_json_value_finishes_with_a_warning(rt: Runtime) -> None:
    sup = rt.start({"q": queue_spec(RUDE)})
    rt.queue("q").dispatch({"do": "return_object"}, id="obj")
    (event,) = rt.wait_events("q", 1)
    assert (event["id"], event["outcome"]) == ("obj", "finished")
    wait_for(lambda: "returned a non-JSON value" in sup.log(), what="the warning")
    assert "handler of q job obj returned a non-JSON value" in sup.log()
    canary(rt, sup.pid)


@pytest.mark.parametrize(
    "error, name, message",
    [
        ("unprintable", "Unprintable", "<unprintable Unprintable>"),
        ("non_json_args", "ValueError", "(<object object at 0x"),
        ("surrogate", "ValueError", "undecodable file name b"),
        ("bad_kind", "KindlessError", "kind is a property that raises"),
        ("huge_message", "ValueError", "mmmm"),
    ],
)
def test_an_exception_that_cannot_be_encoded_is_retried_then_failed_readably(
    rt: Runtime, error: str, name: str, message: str
) -> None:
    spec = queue_spec(
        RUDE, max_retries=1, fail_handler=FAIL_RECORD, fail_options=FAST_FAIL, **FAST_FAIL
    )
    sup = rt.start({"q": spec})
    rt.queue("q").dispatch({"do": "raise", "error": error}, id="e")
    (fail,) = rt.wait_records(1, "fail")
    _, job, described = fail["given"]
    assert (job["id"], job["retry_count"]) == ("e", 1)
    assert (described["name"], described["kind"]) == (name, "retriable")
    assert described["message"].startswith(message)
    assert len(described["message"]) <= 4000
    described["message"].encode()  # valid UTF-8: no lone surrogate left
    retried, failed = rt.wait_events("q", 2)
    assert (retried["outcome"], retried["error_name"]) == ("retried", name)
    assert (failed["outcome"], failed["error_name"]) == ("failed", name)
    assert len(sup.workers()) == 1  # the worker survived
    canary(rt, sup.pid)


@pytest.mark.parametrize("handler", [RUDE, RUDE_ASYNC], ids=["sync", "async"])
@pytest.mark.parametrize(
    "error, name, message",
    [
        ("exiting_str", "ExitingStr", "<unprintable ExitingStr>"),
        ("interrupting_kind", "InterruptingKind", "kind raises KeyboardInterrupt"),
    ],
)
def test_an_exception_raising_a_base_exception_when_described_fails_that_job_alone(
    rt: Runtime, handler: str, error: str, name: str, message: str
) -> None:
    """An exception whose __str__ raises SystemExit, or whose `kind` raises
    KeyboardInterrupt: the worker describes it like any error. Reading it used to raise out
    of the worker's description: the job was never reported (a timeout instead of its
    error) and, for an async handler, the SystemExit ended the worker's event loop, so the
    other async jobs of that worker hung until their timeouts too."""
    sup = rt.start({"q": queue_spec(handler, timeout=30.0, max_retries=0)}, workers=1)
    q = rt.queue("q")
    q.dispatch({"do": "nothing", "sleep": 1.0}, id="innocent")
    q.dispatch({"do": "raise", "error": error}, id="bad")
    events = {e["id"]: e for e in rt.wait_events("q", 2, timeout=10.0)}
    bad, innocent = events["bad"], events["innocent"]
    assert (bad["outcome"], bad["error_name"], bad["error_kind"]) == ("failed", name, "retriable")
    assert bad["error_message"].startswith(message)
    assert bad["timeout_count"] == "0"
    assert (innocent["outcome"], innocent["timeout_count"]) == ("finished", "0")
    (end,) = rt.records("end", id="innocent")
    q.dispatch({"do": "nothing"}, id="after")  # the same worker, its loop alive, goes on
    (after,) = rt.wait_records(1, "end", id="after", timeout=10.0)
    assert after["pid"] == end["pid"]
    assert sup.workers() == {end["pid"]}
    canary(rt, sup.pid)


class _ExitingRepr:
    def __repr__(self) -> str:
        raise SystemExit("repr exits")


def test_a_result_whose_check_raises_a_base_exception_fails_its_job() -> None:
    """A stored result with a non-str key whose repr raises SystemExit: the job fails
    (InvalidResult) instead of the SystemExit leaving the worker's code (for an async
    handler, ending its event loop)."""
    from queasy_py.job import Job
    from queasy_py.runtime.results import stored_result

    value, error = stored_result({_ExitingRepr(): 1}, Job("j", "q", 0.0, 0, 0, 0))
    assert value is None and error is not None
    assert (error["name"], error["kind"]) == ("InvalidResult", "permanent")
    assert "SystemExit: repr exits" in error["message"]


def test_a_handler_printing_megabytes_to_stdout_finishes(rt: Runtime) -> None:
    sup = rt.start({"q": queue_spec(RUDE)}, workers=1)
    rt.queue("q").dispatch({"do": "print_mb", "mb": 8}, id="loud")
    rt.wait_records(1, "end", id="loud", timeout=30.0)
    (event,) = rt.wait_events("q", 1)
    assert event["outcome"] == "finished"
    assert sup.log_path.stat().st_size >= 8 * 1024 * 1024  # it went to the supervisor's stdout
    canary(rt, sup.pid)


@pytest.mark.parametrize("action", ["close_std", "setsid"])
def test_a_handler_closing_stdio_or_calling_setsid_harms_nothing(rt: Runtime, action: str) -> None:
    sup = rt.start({"q": queue_spec(RUDE)}, workers=1)
    rt.queue("q").dispatch({"do": action}, id="rude")
    (end,) = rt.wait_records(1, "end", id="rude")
    worker = end["pid"]
    (event,) = rt.wait_events("q", 1)
    assert event["outcome"] == "finished"
    if action == "setsid":
        assert os.getsid(worker) == worker != os.getsid(sup.pid)
    rt.queue("q").dispatch({"do": "nothing"}, id="after")  # the same worker goes on
    (after,) = rt.wait_records(1, "end", id="after")
    assert after["pid"] == worker
    canary(rt, sup.pid)
    # it is still the supervisor's worker: killed with it on shutdown, wherever it moved
    assert sup.workers() == {worker}
    assert sup.stop() == 0
    wait_for(lambda: not alive(worker), what="the worker to be gone")


@pytest.mark.parametrize("handler", [RUDE, RUDE_ASYNC], ids=["sync", "async"])
def test_a_handler_closing_sys_stderr_does_not_deafen_its_worker(rt: Runtime, handler: str) -> None:
    """The worker's own log lines (here: the warning about a non-JSON return value) go to a
    closed sys.stderr: logging raises ValueError from such a write (it swallows OSError only),
    which stopped the thread reading the pipe, so that job and every later one of the worker
    waited for their timeout."""
    sup = rt.start({"q": queue_spec(handler, timeout=30.0)}, workers=1)
    rt.queue("q").dispatch({"do": "close_stderr"}, id="rude")
    (end,) = rt.wait_records(1, "end", id="rude")
    (event,) = rt.wait_events("q", 1, timeout=5.0)
    assert event["outcome"] == "finished"
    rt.queue("q").dispatch({"do": "nothing"}, id="after")  # the same worker goes on
    (after,) = rt.wait_records(1, "end", id="after", timeout=5.0)
    assert after["pid"] == end["pid"]
    assert [e["outcome"] for e in rt.wait_events("q", 2, timeout=5.0)] == ["finished"] * 2
    assert sup.stop() == 0
    assert "returned a non-JSON value" in sup.log()  # its log lines still reach the log


@pytest.mark.parametrize("action", ["exit_in_task", "stop_loop"])
def test_an_async_handler_cannot_end_its_workers_event_loop(rt: Runtime, action: str) -> None:
    """A task an async handler leaves behind that raises SystemExit (asyncio lets it out of
    run_forever), or a handler that stops the running loop, ended the worker's event loop
    thread: every later async job of that worker waited for its timeout."""
    sup = rt.start({"q": queue_spec(RUDE_ASYNC, timeout=30.0)}, workers=1)
    rt.queue("q").dispatch({"do": action}, id="rude")
    (end,) = rt.wait_records(1, "end", id="rude")
    rt.queue("q").dispatch({"do": "nothing", "sleep": 0.05}, id="after")
    (after,) = rt.wait_records(1, "end", id="after", timeout=5.0)
    assert after["pid"] == end["pid"]
    events = rt.wait_events("q", 2, timeout=5.0)
    assert sorted(e["outcome"] for e in events) == ["finished"] * 2
    assert sup.stop() == 0
