"""The start path (issue 14): `queasy run` and Client.run() start their first workers before
redis-py is imported (store/lazyredis.py), so the workers' interpreter start overlaps that
import (0.15-0.2 s of CPU); a URL redis-py must read at once (options, TLS) still works.

Real subprocesses against the real server: an audit hook in the supervisor's process records,
in order, the first import of redis-py, each worker's start (subprocess.Popen of the worker's
bootstrap) and the supervisor's first connect; the job's handler records that it ran.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from queasy_py import Client, ConfigError
from queasy_py.cli import exitcodes

ROOT = Path(__file__).resolve().parent.parent

#: runs in the supervisor's process before anything else: its events, in order, to $ORDER_LOG
HOOK = """
import os, sys
_log = os.environ["ORDER_LOG"]
_seen = set()
def _mark(what):
    with open(_log, "a") as f:
        f.write(what + "\\n")
def _hook(event, args):
    # importlib.import_module (store/lazyredis.py) raises no "import" event: the import
    # statements of redis-py's own modules do
    if event == "import" and args[0].split(".")[0] == "redis" and "redis" not in _seen:
        _seen.add("redis")
        _mark("import redis")
    elif event == "subprocess.Popen" and "queasy_py.runtime.worker" in " ".join(map(str, args[1])):
        _mark("worker started")
    elif event == "socket.connect" and "connect" not in _seen:
        _seen.add("connect")
        _mark("connect")
sys.addaudithook(_hook)
"""

HANDLER = """
import os

def handle(data, job):
    with open(os.environ["RAN_LOG"], "a") as f:
        f.write(job.id + "\\n")
"""

#: Client.run() in a script of the user's: the client is made at import time, as in an app
RUN_SCRIPT = """
import os, sys
from queasy_py import Client
client = Client(sys.argv[1], workers=2, prefix=sys.argv[2])
client.queue("q").listen("order_handler", size=10)
sys.exit(client.run())
"""

CLI_SCRIPT = """
import sys
from queasy_py.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def run_until_first_job(
    tmp_path: Path, url: str, prefix: str, script: str, *args: str
) -> list[str]:
    """Dispatch one job, start `script ARGS` with the hook; once the job ran, SIGTERM it
    (exit code 0 expected). Returns the hook's events in order."""
    (tmp_path / "sitecustomize.py").write_text(HOOK)
    (tmp_path / "order_handler.py").write_text(HANDLER)
    (tmp_path / "entry.py").write_text(script)
    order, ran = tmp_path / "order.log", tmp_path / "ran.log"
    with Client(url, workers=0, prefix=prefix) as producer:
        producer.queue("q").dispatch({}, id="first")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "QUEASY_REDIS_URL")}
    env.update(PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", ORDER_LOG=str(order), RAN_LOG=str(ran))
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "entry.py"), *args],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(lambda: ran.exists() and ran.read_text() == "first\n", 30, "the first job")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == exitcodes.OK, out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return order.read_text().splitlines()


def test_client_run_starts_its_workers_before_importing_redis_py(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    events = run_until_first_job(tmp_path, redis_url, prefix, RUN_SCRIPT, redis_url, prefix)
    assert events.count("worker started") == 2, events
    assert events[:2] == ["worker started", "worker started"], events  # nothing before them
    assert events.index("import redis") < events.index("connect"), events


def test_queasy_run_starts_its_workers_before_importing_redis_py(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    (tmp_path / "queasy.toml").write_text(
        f'redis = "{redis_url}"\nprefix = "{prefix}"\nworkers = 2\n'
        '[queues.q]\nhandler = "order_handler"\n'
    )
    events = run_until_first_job(tmp_path, redis_url, prefix, CLI_SCRIPT, "run", "queasy.toml")
    assert events[:2] == ["worker started", "worker started"], events


def test_a_url_with_options_is_read_at_once_and_runs(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    """Options redis-py reads (here socket_timeout): its client is made with the Client, as
    before (redis-py imported then, before the workers); a bad value is refused there."""
    url = f"{redis_url}{'&' if '?' in redis_url else '?'}socket_timeout=5"
    events = run_until_first_job(tmp_path, redis_url, prefix, RUN_SCRIPT, url, prefix)
    assert events.index("import redis") < events.index("worker started"), events
    with pytest.raises(ConfigError, match="invalid Redis URL"):
        Client(f"{redis_url}{'&' if '?' in redis_url else '?'}socket_timeout=abc", workers=0)


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:99999/0", "redis://127.0.0.1:port/0", "redis://[::1/0", "REDIS://h:1/0"],
)
def test_a_plain_url_redis_py_would_refuse_is_refused_when_the_client_is_made(url: str) -> None:
    with pytest.raises(ConfigError, match="invalid Redis URL"):
        Client(url, workers=0)


def test_queasy_run_stopped_while_waiting_for_redis_leaves_no_worker(tmp_path: Path) -> None:
    """`queasy run` starts its workers, then waits for a server that does not answer; SIGTERM
    in that wait stops them with it (exit 130, INTERRUPTED), as Ctrl-C does."""
    import psutil

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "order_handler.py").write_text(HANDLER)
    (tmp_path / "entry.py").write_text(CLI_SCRIPT)
    (tmp_path / "queasy.toml").write_text(
        f'redis = "redis://127.0.0.1:{port}/0"\nworkers = 2\n'
        '[queues.q]\nhandler = "order_handler"\n'
    )
    log_path = tmp_path / "run.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "QUEASY_REDIS_URL")}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{ROOT}"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(tmp_path / "entry.py"), "run", "queasy.toml"],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        workers = []
        wait_for(lambda: "(try 1)" in log_path.read_text(), 30, "the wait for Redis")
        workers = psutil.Process(proc.pid).children()
        assert len(workers) == 2, workers  # started before the wait
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == exitcodes.INTERRUPTED, log_path.read_text()
        assert "interrupted: queasy run stopped" in log_path.read_text()
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"workers left running: {alive}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
