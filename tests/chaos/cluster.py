"""The supervisors of a chaos run: `queasy run` processes, each the leader of its own process
group, that the orchestrator starts, SIGKILLs (a whole group, or one worker), freezes
(SIGSTOP/SIGCONT of the group) and restarts. It never imports the supervisor.

Every disruption is logged with its time (taken after the signal was sent) so the checks can
tell a legitimate redelivery (its first holder was killed or swept) from a broken one.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

from .handlers import PERIODIC_QUEUE, RECORDS_URL_ENV, SCHEDULED, TIMEOUT, WORK_QUEUES

ROOT = Path(__file__).resolve().parents[2]
PR_SET_PDEATHSIG = 1

HEARTBEAT_INTERVAL = 0.5
PRIORITIES = {"sched-once": 350, "sched-skip": 350, "high": 300, "periodic": 250, "mid": 200}
PRIORITIES["low"] = 100
QUEUE_OPTIONS = {
    "size": 10,
    "timeout": TIMEOUT,
    "max_retries": 3,
    "max_stalls": 3,
    "max_timeouts": 2,
    "min_backoff": 0.05,
    "max_backoff": 0.5,
}
FAIL_OPTIONS = {
    "priority": 150,
    "timeout": 5.0,
    "max_retries": 100,
    "max_stalls": 100,
    "max_timeouts": 100,
    "min_backoff": 0.05,
    "max_backoff": 0.5,
}


def config_toml(url: str, prefix: str, workers: int) -> str:
    lines = [
        f'redis = "{url}"',
        f'prefix = "{prefix}"',
        f"workers = {workers}",
        f"heartbeat_interval = {HEARTBEAT_INTERVAL}",
        "shutdown_timeout = 5.0",
        "poll_interval = 0.5",
    ]
    handlers = {q: "tests.chaos.handlers.work" for q in WORK_QUEUES}
    handlers[PERIODIC_QUEUE] = "tests.chaos.handlers.periodic"
    handlers.update((q, "tests.chaos.handlers.scheduled") for q in SCHEDULED)
    for name, handler in handlers.items():
        fail = "periodic_failed" if name == PERIODIC_QUEUE else "failed"
        lines += [
            "",
            f"[queues.{name}]",
            f'handler = "{handler}"',
            f"priority = {PRIORITIES[name]}",
            f'fail_handler = "tests.chaos.handlers.{fail}"',
        ]
        lines += [f"{k} = {v!r}" for k, v in QUEUE_OPTIONS.items()]
        lines += [f"{k} = {v!r}".replace("'", '"') for k, v in SCHEDULED.get(name, {}).items()]
        lines += ["", f"[queues.{name}.fail_options]"]
        lines += [f"{k} = {v!r}" for k, v in FAIL_OPTIONS.items()]
    return "\n".join(lines) + "\n"


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL the supervisor if the orchestrator dies (its workers follow)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class Disruption:
    t: float  # epoch seconds, taken after the signal was sent
    kind: str  # "group" (SIGKILL of a process group), "worker" (SIGKILL of one worker)
    pid: int  # the group's id (= its supervisor's pid) or the worker's pid


@dataclass
class Freeze:
    pgid: int
    stopped: float
    resumed: float | None = None
    workers: list[int] = field(default_factory=list)  # their own process groups, if any


@dataclass
class Slot:
    """One supervisor place: the process running in it now, if any."""

    index: int
    workers: int
    proc: subprocess.Popen | None = None
    log: IO[bytes] | None = None
    frozen: Freeze | None = None
    restart_at: float | None = None
    starts: int = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def healthy(self) -> bool:
        return self.proc is not None and self.frozen is None and self.proc.poll() is None


@dataclass
class Cluster:
    url: str
    prefix: str
    workdir: Path
    seed: int
    records_url: str | None = None  # the handlers' records server (RECORDS_URL_ENV)
    slots: list[Slot] = field(default_factory=list)
    kills: list[Disruption] = field(default_factory=list)
    freezes: list[Freeze] = field(default_factory=list)
    exits: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.command = self._command()

    @staticmethod
    def _command() -> list[str]:
        script = shutil.which("queasy", path=os.path.dirname(sys.executable))
        return [script] if script else [sys.executable, "-m", "queasy_py.cli"]

    def add(self, workers: int) -> Slot:
        slot = Slot(len(self.slots), workers)
        self.slots.append(slot)
        config = self.workdir / f"chaos-{workers}.toml"
        if not config.exists():
            config.write_text(config_toml(self.url, self.prefix, workers))
        return slot

    def start(self, slot: Slot) -> None:
        config = self.workdir / f"chaos-{slot.workers}.toml"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "QUEASY_RESCHEDULE_DELAY": "0.5",
            "CHAOS_SEED": str(self.seed),
        }
        if self.records_url:
            env[RECORDS_URL_ENV] = self.records_url
        slot.starts += 1
        log_path = self.workdir / f"supervisor-{slot.index}-{slot.starts}.log"
        slot.log = log_path.open("wb")
        slot.proc = subprocess.Popen(
            [*self.command, "--log-level", "WARNING", "run", str(config)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=slot.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only a prctl, no locks taken
        )
        slot.restart_at = None

    def _reap(self, slot: Slot) -> None:
        assert slot.proc is not None and slot.log is not None
        code = slot.proc.wait(timeout=15)
        if code not in (0, -signal.SIGKILL):
            self.exits.append(f"supervisor {slot.pid} (slot {slot.index}) exited with {code}")
        slot.log.close()
        slot.proc, slot.log = None, None

    def check_exits(self) -> list[str]:
        """Supervisors that ended on their own (they never should during a run)."""
        found = []
        for slot in self.slots:
            if slot.proc is not None and slot.frozen is None and slot.proc.poll() is not None:
                found.append(f"supervisor {slot.pid} exited by itself with {slot.proc.returncode}")
                self._kill_group(slot.pid)
                self._reap(slot)
                slot.restart_at = time.time() + 1.0
        return found

    # ---------------------------------------------------------------- disruptions

    @staticmethod
    def _kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _signal_all(self, slot: Slot, sig: int, workers: list[int] | None = None) -> None:
        """`sig` to the supervisor's process group and to each worker's own group (workers
        lead their own session). A SIGKILL stops the supervisor first, then kills its workers,
        then it: it neither replaces them nor hands them jobs meanwhile (a machine lost)."""
        if workers is None:
            workers = self.workers_of(slot)
        if sig == signal.SIGKILL:
            self._kill_group(slot.pid, signal.SIGSTOP)
        else:
            self._kill_group(slot.pid, sig)
        for pid in workers:
            self._kill_group(pid, sig)  # no such group: the workers were in the first one
        if sig == signal.SIGKILL:
            self._kill_group(slot.pid, sig)

    def kill_group(self, slot: Slot, restart_in: float) -> None:
        """SIGKILL a supervisor with its workers (a machine lost)."""
        pgid = slot.pid
        self._signal_all(slot, signal.SIGKILL)
        self.kills.append(Disruption(time.time(), "group", pgid))
        if slot.frozen is not None:
            slot.frozen.resumed = time.time()
            slot.frozen = None
        self._reap(slot)
        slot.restart_at = time.time() + restart_in

    def workers_of(self, slot: Slot) -> list[int]:
        try:
            children = psutil.Process(slot.pid).children()
        except psutil.Error:
            return []
        pids = []
        for child in children:
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    pids.append(child.pid)
            except psutil.Error:
                pass
        return pids

    def kill_worker(self, slot: Slot, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.kills.append(Disruption(time.time(), "worker", pid))

    def freeze(self, slot: Slot) -> None:
        workers = self.workers_of(slot)
        self._signal_all(slot, signal.SIGSTOP, workers)
        slot.frozen = Freeze(slot.pid, time.time(), workers=workers)
        self.freezes.append(slot.frozen)

    def thaw(self, slot: Slot) -> None:
        if slot.frozen is not None and slot.proc is not None:
            self._signal_all(slot, signal.SIGCONT, slot.frozen.workers)
            slot.frozen.resumed = time.time()
        slot.frozen = None

    # ---------------------------------------------------------------- end

    def stop_all(self, timeout: float = 15.0) -> None:
        """Thaw, SIGTERM every group, wait for a graceful stop, then SIGKILL what is left."""
        workers: dict[int, list[int]] = {}
        for slot in self.slots:
            self.thaw(slot)
            if slot.proc is not None:
                workers[slot.index] = self.workers_of(slot)
                self._kill_group(slot.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for slot in self.slots:
            if slot.proc is None:
                continue
            try:
                slot.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # workers left behind, if any
            self._signal_all(slot, signal.SIGKILL, workers.get(slot.index, []))
            self._reap(slot)

    def logs(self) -> list[Path]:
        return sorted(self.workdir.glob("supervisor-*.log"))
