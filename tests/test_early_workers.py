"""Workers started first (runtime/early.py): run() starts its first workers before it
connects, loads the library and builds its supervisor, which adopts them; workers no
supervisor took are stopped, and so are those started for other handlers.

Real worker subprocesses and a real server; the supervisor's loop is not run where a test
only needs its workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from runtime_helpers import close_unrun

from queasy_py import Client, ConfigError, ConnectionFailed, QueasyError
from queasy_py.runtime.early import start_early
from queasy_py.runtime.supervisor import Supervisor

HANDLER = "tests.runtime_handlers.quiet"


def worker_children() -> set[int]:
    """The pids of this process's worker subprocesses (pool.BOOTSTRAP's command line)."""
    out = set()
    for child in psutil.Process().children():
        try:
            if any("queasy_py.runtime.worker" in part for part in child.cmdline()):
                out.add(child.pid)
        except psutil.Error:
            pass
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_starts_workers_before_connecting_and_stops_them_when_it_cannot(
    prefix: str,
) -> None:
    """Nothing listens at the URL: run() fails connecting (ConnectionFailed after its
    attempts), yet its workers were started before, and none is left after."""
    client = Client(f"redis://127.0.0.1:{free_port()}/0", prefix=prefix, workers=2)
    client.queue("early").listen(HANDLER)
    before = worker_children()
    seen: set[int] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(worker_children() - before)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(ConnectionFailed):
            client.run()
    finally:
        done.set()
        watcher.join()
        client.close()
    assert seen, "no worker was started while run() was connecting"
    assert not (seen & worker_children()), "workers left after run() failed"


def test_the_supervisor_adopts_the_workers_started_first(redis_url: str, prefix: str) -> None:
    """A queue with a fail handler and one storing results: the supervisor's handlers,
    result queues and environment are those the workers were started with, so it takes
    them (the same processes, their "ready" read by it) and starts no others."""
    client = Client(redis_url, prefix=prefix, workers=2)
    client.queue("adopt").listen(HANDLER, fail_handler=HANDLER)
    client.queue("kept").listen(HANDLER, store_results=True)
    early = start_early(client)
    pids = {proc.pid for proc in early.procs}
    assert len(pids) == min(2, psutil.cpu_count() or 1)
    sup = Supervisor(client, early)
    workers = sup.workers
    try:
        assert {proc.pid for proc in workers.procs} == pids
        assert not early.procs  # the supervisor's now: closing `early` stops none of them
        early.close()
        assert all(psutil.pid_exists(pid) for pid in pids)
        deadline = time.monotonic() + 60
        while not all(w.ready for w in workers.procs):
            assert time.monotonic() < deadline
            for key, _ in sup.events.select(1.0):
                kind, proc = key.data
                if kind == "conn":
                    workers.receive(proc)
        assert {proc.pid for proc in workers.procs} == pids
    finally:
        close_unrun(sup, client)


def test_workers_started_for_other_handlers_are_stopped_not_adopted(
    redis_url: str, prefix: str
) -> None:
    client = Client(redis_url, prefix=prefix, workers=1)
    client.queue("first").listen(HANDLER)
    early = start_early(client)
    pids = {proc.pid for proc in early.procs}
    client.queue("second").listen(HANDLER)  # listened to after they were started
    sup = Supervisor(client, early)
    try:
        assert sup.workers.procs == [] and early.procs == []
        assert not any(psutil.pid_exists(pid) for pid in pids)
    finally:
        close_unrun(sup, client)


def test_workers_started_first_are_stopped_when_the_supervisor_refuses_the_config(
    redis_url: str, prefix: str
) -> None:
    """A metrics port another process holds: the supervisor refuses it (ConfigError) after
    run() started the workers, and run() stops them. (This test used a queue listened to as
    another's fail queue too, which listen() now refuses before run().)"""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        client = Client(redis_url, prefix=prefix, workers=2, metrics_port=taken.getsockname()[1])
        client.queue("refused").listen(HANDLER)
        before = worker_children()
        try:
            with pytest.raises(ConfigError, match="in use"):
                client.run()
        finally:
            client.close()
    assert not (worker_children() - before), "workers left after run() failed"


#: a handler whose import takes 60 s in a worker (not in the process that listens: listen()
#: imports it too)
SLOW_IMPORT = """
import os, time
if os.environ["LISTENING_PID"] != str(os.getpid()):
    time.sleep(60)


def handle(data, job):
    return None
"""

RUN_UNREACHABLE = """
import os, socket, sys
from queasy_py import Client
os.environ["LISTENING_PID"] = str(os.getpid())
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
client = Client(f"redis://127.0.0.1:{port}/0", prefix=sys.argv[1], workers=2)
client.queue("early").listen("slow_import_handler")
client.run()
"""


def test_sigterm_while_run_connects_stops_the_workers_it_started(
    tmp_path: Path, prefix: str
) -> None:
    """SIGTERM to a process whose run() started its workers and is still connecting (no
    supervisor's handler yet): its workers, still importing a handler that takes 60 s, go
    with it. SIGTERM's default action ended the process at once and left them to finish
    their imports (a hung one: for ever)."""
    (tmp_path / "slow_import_handler.py").write_text(SLOW_IMPORT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    proc = subprocess.Popen([sys.executable, "-c", RUN_UNREACHABLE, prefix], env=env)
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < min(2, psutil.cpu_count() or 1):
            assert time.monotonic() < deadline, "run() started no workers"
            assert proc.poll() is None, "run() ended before it started its workers"
            workers = [
                child
                for child in psutil.Process(proc.pid).children()
                if any("queasy_py.runtime.worker" in part for part in child.cmdline())
            ]
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, "workers outlived the process whose run() started them"
    finally:
        proc.kill()
        proc.wait()
        for worker in workers:
            with contextlib.suppress(psutil.Error):
                worker.kill()


def test_an_interrupt_after_the_adoption_before_the_loop_runs_leaves_no_worker(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C after the supervisor adopted the workers, before its run() took over the
    signals (here: as it installs its handlers): run() stops the workers the supervisor
    holds, as it stops those not adopted."""

    def interrupted(self: Supervisor) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Supervisor, "_install_signals", interrupted)
    client = Client(redis_url, prefix=prefix, workers=2)
    client.queue("early").listen(HANDLER)
    before = worker_children()
    try:
        with pytest.raises(KeyboardInterrupt):
            client.run()
    finally:
        client.close()
    left = [psutil.Process(pid) for pid in worker_children() - before]
    gone, alive = psutil.wait_procs(left, timeout=10)
    assert not alive, "workers left after run() was interrupted"


def test_run_while_run_runs_is_refused_and_starts_no_workers(redis_url: str, prefix: str) -> None:
    """run() while this client's run() runs (another thread): refused (QueasyError), no
    second set of workers started, the first supervisor left running. A second supervisor
    under the same client id would share its leases and heartbeat."""
    client = Client(redis_url, prefix=prefix, workers=1)
    client.queue("twice").listen(HANDLER)
    before = worker_children()
    outcomes: dict[str, object] = {}

    def run(name: str) -> None:
        try:
            outcomes[name] = client.run()
        except BaseException as exc:  # noqa: BLE001 (the outcome is what is asserted)
            outcomes[name] = exc

    first = threading.Thread(target=run, args=("first",))
    first.start()
    second = None
    try:
        deadline = time.monotonic() + 60
        while client._supervisor is None or len(worker_children() - before) < 1:
            assert time.monotonic() < deadline and first.is_alive()
            time.sleep(0.02)
        running = worker_children() - before
        second = threading.Thread(target=run, args=("second",))
        second.start()
        second.join(timeout=30)
        assert not second.is_alive(), "a second run() runs alongside the first"
        assert isinstance(outcomes["second"], QueasyError)
        assert "already running" in str(outcomes["second"])
        assert worker_children() - before == running and first.is_alive()
    finally:
        deadline = time.monotonic() + 60
        for thread in (first, second):
            while thread is not None and thread.is_alive() and time.monotonic() < deadline:
                client.stop()
                thread.join(timeout=0.5)
        client.close()
    assert outcomes["first"] == 0
