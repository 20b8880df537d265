"""Helpers of the runtime tests: supervisors as real subprocesses, records, events, waits.

A test gets a `Runtime` (fixture `rt` in each test module). `rt.start(...)` runs
tests/supervisor_main.py in a new session, a process group that a test can signal (SIGTERM,
SIGKILL, SIGSTOP/SIGCONT) like a terminal's Ctrl-C does; each worker leads a session of its
own (`signal_all` reaches them too), and teardown kills them all. Handlers
(tests/runtime_handlers/) append records to `<prefix>:records`, read by `rt.records()`.

The handler package is not called tests/handlers: pytest puts tests/ on sys.path, where it
would be a top-level `handlers` package (the project's own ready-made handlers are
queasy_py.handlers and install no top-level name).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import psutil
import pytest
import redis
from lua_calls import EVENT_FIELDS  # noqa: F401 - re-exported for the runtime tests

from queasy_py import Client, Queue
from queasy_py.store import events
from queasy_py.store.keys import QueueKeys

ROOT = Path(__file__).resolve().parent.parent
#: the start of a line of a supervisor's log (tests/supervisor_main.py's format)
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (supervisor|worker)\[")
T = TypeVar("T")

#: supervisor settings of the tests (fast heartbeats), unless a test overrides them
SETTINGS = {"heartbeat_interval": 0.5, "shutdown_timeout": 5.0}

ACT = "tests.runtime_handlers.act"
ACT_ASYNC = "tests.runtime_handlers.act_async"
FAIL_RECORD = "tests.runtime_handlers.fail_record"


#: run a runtime test on the embedded server and on a local Redis Cluster (3 primaries)
ON_CLUSTER = pytest.mark.parametrize("rt", ["single", "cluster"], indirect=True)


@contextlib.contextmanager
def runtime(
    request: Any, redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path
) -> Iterator[Runtime]:
    """The `rt` of a test: on the embedded server, or (param 'cluster', ON_CLUSTER) with the
    queues on the session's local cluster and the handlers' records on the embedded server."""
    if getattr(request, "param", "single") != "cluster":
        with Runtime(redis_url, prefix, r, tmp_path) as rt:
            yield rt
        return
    from redis.cluster import RedisCluster

    from queasy_py.store.clusterurl import parse_cluster_url

    cluster = request.getfixturevalue("local_cluster")
    nodes, options = parse_cluster_url(cluster.url)
    view = RedisCluster(startup_nodes=nodes, decode_responses=True, **options)  # as `r`
    try:
        with Runtime(cluster.url, prefix, view, tmp_path, (redis_url, r)) as rt:  # type: ignore[arg-type]
            yield rt
    finally:
        view.close()


def wait_for(predicate: Callable[[], T], timeout: float = 15.0, what: str = "") -> T:
    """Poll `predicate` every 25 ms until it returns a truthy value; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.025)


def queue_spec(handler: str = ACT, **options: Any) -> dict[str, Any]:
    """One entry of Runtime.start's `queues`: a handler and its listen() options."""
    return {"handler": handler, **options}


def max_units_in_flight(records: list[dict[str, Any]]) -> int:
    """The most units held at once by the [start, end] intervals of these records."""
    starts = {r["id"]: r for r in records if r["event"] == "start"}
    points = []
    for end in (r for r in records if r["event"] == "end"):
        start = starts[end["id"]]
        points.append((start["t"], 1, start["units"]))
        points.append((end["t"], 0, -start["units"]))  # ends sort before starts at a tie
    held = peak = 0
    for _, _, units in sorted(points):
        held += units
        peak = max(peak, held)
    return peak


@dataclass
class Supervisor:
    """A supervisor subprocess, leader of its own process group."""

    proc: subprocess.Popen
    log_path: Path
    log_file: IO[bytes]
    code: int | None = field(default=None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def signal_group(self, sig: int) -> None:
        """Signal the supervisor's process group (as a terminal does): not its workers."""
        os.killpg(self.pid, sig)

    def signal_all(self, sig: int) -> None:
        """Signal the supervisor's process group and each of its workers' (a worker leads
        its own): the workers first, while they are still the supervisor's children."""
        for pid in self.workers():
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
        os.killpg(self.pid, sig)

    def wait(self, timeout: float = 15.0) -> int:
        self.code = self.proc.wait(timeout=timeout)
        return self.code

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then the exit code."""
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_without_job_tracebacks(self) -> str:
        """The log less the handlers' tracebacks it quotes on purpose (a job failed for good
        at ERROR, a retry's at DEBUG): what is left holds a traceback only if something of
        queasy itself raised."""
        kept, quoting = [], False
        for line in self.log().splitlines():
            if LOG_LINE.match(line):
                quoting = "failed for good (attempt" in line or "traceback of job" in line
            elif quoting:
                continue
            kept.append(line)
        return "\n".join(kept)

    def workers(self) -> set[int]:
        """Pids of its live worker processes."""
        try:
            children = psutil.Process(self.pid).children()
        except psutil.NoSuchProcess:
            return set()
        return {c.pid for c in children if c.status() != psutil.STATUS_ZOMBIE}

    def client_of(self, event: dict[str, str]) -> bool:
        """Whether this supervisor wrote an outcome event (its client ids start with its pid)."""
        return event["client"].startswith(f"{self.pid}-")

    def kill_group(self) -> None:
        """SIGKILL the supervisor's process group and its workers' groups: a machine lost at
        once. The supervisor is stopped first, so it does not see its workers die before it
        (it would put their jobs back to waiting as stalled)."""
        try:
            os.killpg(self.pid, signal.SIGSTOP)
            self.signal_all(signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        self.log_file.close()


class Runtime:
    """Supervisors, a producer client and the records of one test (a context manager)."""

    def __init__(
        self,
        url: str,
        prefix: str,
        r: redis.Redis,
        tmp_path: Path,
        records: tuple[str, redis.Redis] | None = None,
    ) -> None:
        """`records`: (url, connection) of another server for the handlers' records (a
        test that makes the queues' server refuse writes or freeze keeps its facts there)."""
        self.url = url
        self.prefix = prefix
        self.r = r
        self.records_url, self.rec = records or (url, r)
        self.tmp_path = tmp_path
        self.supervisors: list[Supervisor] = []
        self._producer: Client | None = None

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        for sup in self.supervisors:
            sup.kill_group()
            print(f"----- supervisor {sup.pid} (exit {sup.proc.returncode}) -----")
            print(sup.log())
        if self._producer is not None:
            self._producer.close()

    # ---------------------------------------------------------------- processes

    def start(
        self,
        queues: dict[str, dict[str, Any]],
        workers: int = 1,
        cwd: Path | None = None,
        sys_path: list[str] | None = None,
        clock_skew: float = 0.0,
        clock_step: float | None = None,
        root: Path = ROOT,
        **settings: Any,
    ) -> Supervisor:
        """Start a supervisor listening on `queues` ({name: queue_spec(...)}). With `cwd` it
        runs there, started as a script (like a console script: the working directory is not
        on its sys.path); `sys_path` entries go first on its sys.path once it is running;
        `clock_skew` seconds are added to the supervisor's clock (not its workers'), and
        `clock_step` seconds more at each SIGUSR1 (a clock stepped while it runs); `root`:
        the checkout whose queasy_py and tests/ it runs (another version's: see
        tests/test_rolling_upgrade.py)."""
        config = {
            "url": self.url,
            "prefix": self.prefix,
            "workers": workers,
            "settings": {**SETTINGS, **settings},
            "queues": queues,
            "sys_path": sys_path or [],
            "clock_skew": clock_skew,
        }
        if clock_step is not None:
            config["clock_step"] = clock_step
        main = (
            ["-m", "tests.supervisor_main"]
            if cwd is None
            else [str(root / "tests/supervisor_main.py")]
        )
        env = {
            **os.environ,
            "PYTHONPATH": str(root),
            "QUEASY_TEST_URL": self.records_url,
            "QUEASY_TEST_PREFIX": self.prefix,
        }
        log_path = self.tmp_path / f"supervisor-{len(self.supervisors)}.log"
        log_file = log_path.open("wb")
        proc = subprocess.Popen(
            [sys.executable, *main, json.dumps(config)],
            cwd=cwd or root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        sup = Supervisor(proc, log_path, log_file)
        self.supervisors.append(sup)
        return sup

    # ---------------------------------------------------------------- producer side

    def queue(self, name: str) -> Queue:
        if self._producer is None:
            self._producer = Client(self.url, workers=0, prefix=self.prefix)
        return self._producer.queue(name)

    def open_gate(self, name: str) -> None:
        """Let one job blocked on data {"gate": name} go on."""
        self.rec.rpush(f"{self.prefix}:gate:{name}", 1)

    # ---------------------------------------------------------------- facts

    def records(self, event: str | None = None, **match: Any) -> list[dict[str, Any]]:
        """Handler records in order, those with this event and these field values."""
        out = [json.loads(x) for x in self.rec.lrange(f"{self.prefix}:records", 0, -1)]
        return [
            rec
            for rec in out
            if (event is None or rec["event"] == event)
            and all(rec.get(k) == v for k, v in match.items())
        ]

    def wait_records(
        self, n: int, event: str | None = None, timeout: float = 15.0, **match: Any
    ) -> list[dict[str, Any]]:
        """Wait until there are at least n matching records; return them."""
        return wait_for(
            lambda: (found := self.records(event, **match)) and len(found) >= n and found,
            timeout,
            f"{n} record(s) {event} {match}",
        )

    def events(self, queue: str, tag: str | None = None) -> list[dict[str, str]]:
        """The outcome events of `queue` (tag: the hash tag, for a fail queue its owner's)."""
        stream = QueueKeys(self.prefix, queue, tag or queue).events
        return [events.fields_of(raw, queue) for _, raw in self.r.xrange(stream)]

    def wait_events(
        self, queue: str, n: int, tag: str | None = None, timeout: float = 15.0
    ) -> list[dict[str, str]]:
        """Wait until `queue` has at least n outcome events; return them all."""
        return wait_for(
            lambda: len(found := self.events(queue, tag)) >= n and found,
            timeout,
            f"{n} outcome event(s) on {queue}",
        )


def close_unrun(sup: Any, client: Client) -> None:
    """Close what a Supervisor built but never ran holds (its workers, wake-up, round pipe,
    connection and selector), then its client."""
    sup.workers.close()
    sup.wakeup.close()
    sup.rounds.pipe.close()
    sup.r.close()
    sup.events.close()
    client.close()
