"""The project's shared, durable embedded server (issue #10): every queasy process of a project
with no Redis URL meets on one server whose data survives restarts; none is left behind.

Real `queasy` subprocesses in a temporary project directory (a pyproject.toml with a
[tool.queasy] table and a handler package writing what it ran to a file); every wait bounded.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import psutil
import pytest
import redis
from lua_calls import live

from queasy_py import Client, defaults
from queasy_py.errors import QueasyError
from queasy_py.resolve import data_dir_for, resolve
from queasy_py.store.shared import join

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("QUEASY_TEST_REDIS_URL")), reason="tests the embedded server itself"
)

REPO = Path(__file__).resolve().parent.parent
QUEASY = str(Path(sys.executable).with_name("queasy"))

PYPROJECT = """\
[project]
name = "shop"

[tool.queasy]
workers = 1
heartbeat_interval = 0.5
shutdown_timeout = 2.0

[tool.queasy.queues.q]
handler = "app.jobs"
size = 100
"""

#: the project's handler: "block" sleeps on its first run; every job writes what it ran
HANDLER = """\
import os, time

DONE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "done.txt")


def handle(data, job):
    with open(DONE, "a") as f:
        f.write(f"start {data}\\n")
    if data == "block" and job.stall_count == 0:
        time.sleep(60)
    with open(DONE, "a") as f:
        f.write(f"end {data}\\n")
"""


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def refused(path: str) -> bool:
    """True once nothing listens on the unix socket `path`."""
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(path)
            return False
        except OSError:
            return True


def pid_gone(pid: int) -> bool:
    try:  # a dead process not reaped yet (a zombie) is gone too
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Project:
    """A temporary project directory, and the queasy processes started in it."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "shop"
        (self.dir / "app").mkdir(parents=True)
        (self.dir / "pyproject.toml").write_text(PYPROJECT)
        (self.dir / "app" / "__init__.py").write_text("")
        (self.dir / "app" / "jobs.py").write_text(HANDLER)
        self.data_dir = self.dir / defaults.STATE_DIR_NAME
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in (defaults.URL_ENV, defaults.DATA_DIR_ENV, "PYTHONPATH")
        }
        self.env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(self.dir)])
        self.env["XDG_STATE_HOME"] = str(root / "state")
        self.procs: list[tuple[subprocess.Popen[str], IO[str]]] = []
        self.pids: set[int] = set()  # servers and keepers seen: killed at teardown if alive

    def queasy(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [QUEASY, *args], cwd=cwd or self.dir, env=self.env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    def start(self, *args: str) -> subprocess.Popen[str]:
        """A long-running `queasy` command; its output goes to a file (`output(proc)`)."""
        out = open(self.dir / f"out-{len(self.procs)}.log", "w+")  # noqa: SIM115
        proc = subprocess.Popen(
            [QUEASY, *args], cwd=self.dir, env=self.env, stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.procs.append((proc, out))
        return proc

    def output(self, proc: subprocess.Popen[str]) -> str:
        return Path(next(out.name for p, out in self.procs if p is proc)).read_text()

    def info(self) -> dict[str, Any] | None:
        try:
            info = json.loads((self.data_dir / "server.json").read_text())
        except (OSError, ValueError):
            return None
        self.pids.update((info["pid"], info["keeper_pid"]))
        return dict(info)

    def done(self) -> list[str]:
        try:
            return (self.dir / "app" / "done.txt").read_text().splitlines()
        except FileNotFoundError:
            return []

    def counts(self, url: str) -> dict[str, int]:
        """The jobs per live state (not the totals of ended ones)."""
        with Client(url, workers=0) as client:
            return live(client.queue("q").counts())

    def assert_gone(self, info: dict[str, Any], timeout: float = 15.0) -> None:
        """No server process and no keeper of `info` is left (bounded wait)."""
        for key in ("pid", "keeper_pid"):
            wait_for(lambda pid=info[key]: pid_gone(pid), timeout, f"{key} {info[key]} to exit")
        assert not (self.data_dir / "server.json").exists()

    def close(self) -> None:
        for proc, out in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            out.close()
        self.info()  # the pids of a server still running
        for pid in self.pids:  # do not leak a server when a test fails
            if not pid_gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Project]:
    for name in (defaults.URL_ENV, defaults.DATA_DIR_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    made = Project(tmp_path)
    try:
        yield made
    finally:
        made.close()


# ---------------------------------------------------------------- one server per project


def test_queasy_run_and_queasy_dispatch_meet_on_one_server(project: Project) -> None:
    run = project.start("run")
    info = wait_for(project.info, 30, "the run's embedded server")
    dispatched = project.queasy("dispatch", "q", '"hello"', cwd=project.dir / "app")
    assert dispatched.returncode == 0, dispatched.stderr
    assert (
        f"using the embedded server of {project.data_dir} at unix://:***@{info['socket']}"
        in dispatched.stderr
    )
    assert "already running" in dispatched.stderr  # it joined the run's server
    wait_for(lambda: "end hello" in project.done(), 30, "the dispatched job to run")
    assert project.info() == info  # one server throughout
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=30) == 0, project.output(run)
    assert "started by this process" in project.output(run)
    project.assert_gone(info)  # stopped with its last user
    assert "stopped the embedded server" in project.output(run)


def test_a_killed_run_leaves_no_server_and_its_restart_runs_the_waiting_and_delayed_jobs(
    project: Project,
) -> None:
    run = project.start("run")
    info = wait_for(project.info, 30, "the run's embedded server")
    for args in (["block"], ["waiting"], ["delayed", "--delay", "8"]):
        done = project.queasy("dispatch", "q", json.dumps(args[0]), *args[1:])
        assert done.returncode == 0, done.stderr
        if args[0] == "block":  # it takes the only worker's 100 units
            wait_for(lambda: "start block" in project.done(), 30, "the blocking job")
    assert project.counts(info["url"]) == {"waiting": 1, "delayed": 1, "blocked": 0, "active": 1}
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=30)
    project.assert_gone(info)  # the keeper noticed: no process uses the server
    assert "waiting" not in " ".join(project.done())
    again = project.start("run")
    wait_for(
        lambda: {"end waiting", "end delayed", "end block"} <= set(project.done()),
        30,
        f"the jobs kept on disk to run after the restart: {project.done()}",
    )
    assert project.info()["pid"] != info["pid"]  # type: ignore[index]
    again.send_signal(signal.SIGTERM)
    assert again.wait(timeout=30) == 0, project.output(again)


def test_a_client_script_logs_its_server_and_its_job_survives_its_exit(project: Project) -> None:
    script = (
        "import logging\n"
        "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s %(message)s')\n"
        "from queasy_py import Client\n"
        "client = Client(workers=0)\n"
        "client.queue('q').dispatch('from-script')\n"
        "client.queue('q').dispatch('later', delay=1.0)\n"
        "print(json.dumps([client.server.pid, client.server.keeper_pid, client.server.password]))\n"
    )  # no close(): the process just ends
    done = subprocess.run(
        [sys.executable, "-c", "import json\n" + script],
        cwd=project.dir / "app",  # the project is found walking up
        env=project.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    pid, keeper_pid, password = json.loads(done.stdout)
    assert f"INFO queasy_py using the embedded server of {project.data_dir} at unix://:***@" in (
        done.stderr
    )
    assert "WARNING queasy_py.embedded the embedded server of" in done.stderr
    assert "stopped with this process, the only one using it" in done.stderr
    assert password not in done.stderr
    project.assert_gone({"pid": pid, "keeper_pid": keeper_pid})
    run = project.start("run")
    wait_for(
        lambda: {"end from-script", "end later"} <= set(project.done()),
        30,
        "the script's jobs to run under `queasy run`",
    )
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=30) == 0, project.output(run)


RACER = """
import sys, time
from queasy_py.store.shared import join
time.sleep(max(0.0, float(sys.argv[1]) - time.time()))
server = join(sys.argv[2])
print(server.pid, server.keeper_pid, flush=True)
sys.stdin.read()  # keep using it until the test closes stdin
server.close()
"""


def test_processes_starting_at_once_make_one_server(project: Project) -> None:
    at = time.time() + 1.5
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(at), str(project.data_dir)],
            env=project.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(4)
    ]
    try:
        seen = {racer.stdout.readline() for racer in racers}  # type: ignore[union-attr]
        assert len(seen) == 1, seen
        pid, keeper_pid = map(int, seen.pop().split())
        project.pids.update((pid, keeper_pid))
        keepers = [
            p
            for p in psutil.process_iter(["cmdline"])
            if "queasy_py.store.keeper" in (p.info["cmdline"] or [])
            and str(project.data_dir) in (p.info["cmdline"] or [])
        ]
        assert [p.pid for p in keepers] == [keeper_pid]
        assert [c.pid for c in psutil.Process(keeper_pid).children()] == [pid]
    finally:
        for racer in racers:
            racer.communicate(timeout=30)  # closes stdin: each leaves the server
    assert all(racer.returncode == 0 for racer in racers)
    project.assert_gone({"pid": pid, "keeper_pid": keeper_pid})


def test_a_killed_keeper_takes_its_server_along_and_the_next_start_replaces_its_files(
    project: Project,
) -> None:
    server = join(project.data_dir)
    project.pids.update((server.pid, server.keeper_pid))  # type: ignore[arg-type]
    with redis.Redis.from_url(server.url) as conn:
        conn.set("kept", "1")
    os.kill(server.keeper_pid, signal.SIGKILL)  # type: ignore[arg-type]
    wait_for(lambda: pid_gone(server.pid), 10, "the server to die with its keeper")  # type: ignore[arg-type]
    assert (project.data_dir / "server.json").exists()  # stale
    assert Path(server.socket).exists()  # stale: a killed server cannot remove it
    server.close()
    again = join(project.data_dir)
    try:
        project.pids.update((again.pid, again.keeper_pid))  # type: ignore[arg-type]
        assert again.started and again.pid != server.pid
        with redis.Redis.from_url(again.url) as conn:
            assert conn.get("kept") == b"1"  # written before the kill: in the append-only file
    finally:
        assert again.close()
    project.assert_gone({"pid": again.pid, "keeper_pid": again.keeper_pid})


def test_a_start_right_after_the_server_died_gets_a_live_server(project: Project) -> None:
    """valkey-server died (SIGKILL, the OOM killer) under a running process; a start within
    the keeper's poll interval found its keeper still alive and was handed the dead server's
    server.json: `queasy run` then retried a socket no one would serve again, as no other
    process came to start one. It now waits for the keeper to go and starts a new server."""
    first = join(project.data_dir)
    project.pids.update((first.pid, first.keeper_pid))  # type: ignore[arg-type]
    with redis.Redis.from_url(first.url) as conn:
        conn.set("kept", "1")
    # the keeper frozen for 1 s: the start below comes before it notices, every time
    os.kill(first.keeper_pid, signal.SIGSTOP)  # type: ignore[arg-type]
    thaw = threading.Timer(1.0, os.kill, (first.keeper_pid, signal.SIGCONT))
    thaw.start()
    try:
        os.kill(first.pid, signal.SIGKILL)  # type: ignore[arg-type]
        wait_for(lambda: refused(first.socket), 10, "the server to die")  # all its threads
        again = join(project.data_dir)
    finally:
        thaw.join()
    try:
        project.pids.update((again.pid, again.keeper_pid))  # type: ignore[arg-type]
        assert again.pid != first.pid
        with redis.Redis.from_url(again.url, socket_timeout=5) as conn:
            assert conn.get("kept") == b"1"
    finally:
        first.close()
        assert again.close()


def test_queasy_server_serves_the_project_in_the_foreground(project: Project) -> None:
    served = project.start("server")
    info = wait_for(project.info, 30, "`queasy server` to start the server")
    wait_for(lambda: "serving" in project.output(served), 10, "the serving line")
    out = project.output(served)
    assert f"serving the embedded server of {project.data_dir} on unix socket" in out
    assert info["socket"] in out and "no TCP port" in out
    password = info["url"].split("@")[0].rsplit(":", 1)[1]
    assert password not in out
    dispatched = project.queasy("dispatch", "q", '"x"')
    assert dispatched.returncode == 0 and "already running" in dispatched.stderr
    served.send_signal(signal.SIGINT)  # Ctrl-C
    assert served.wait(timeout=30) == 0, project.output(served)
    project.assert_gone(info)  # no other process used it: it stopped


def test_queasy_server_outlives_a_server_paused_for_a_second_and_one_that_died(
    project: Project,
) -> None:
    """`queasy server` took one PING without a reply within 0.5 s (a server busy or paused
    for a second: a slow disk, swap, a stalled VM) for its death: it exited 1 and, the only
    user, had the keeper stop the live server. A real death (the OOM killer) stopped it
    too, and every process using the server waited until another command started one: the
    keeper now starts it again, with its data, while processes use it."""
    served = project.start("server")
    info = wait_for(project.info, 30, "`queasy server` to start the server")
    wait_for(lambda: "serving" in project.output(served), 10, "the serving line")
    os.kill(info["pid"], signal.SIGSTOP)
    try:
        time.sleep(1.5)
    finally:
        os.kill(info["pid"], signal.SIGCONT)
    time.sleep(1.0)
    assert served.poll() is None, project.output(served)
    assert project.info() == info  # the same server, still running
    with redis.Redis.from_url(info["url"], socket_timeout=5) as conn:
        assert conn.ping()
        conn.set("kept", "1")
    os.kill(info["pid"], signal.SIGKILL)  # a real death: started again, the same data
    again = wait_for(
        lambda: (i := project.info()) is not None and i["pid"] != info["pid"] and i,
        30,
        "the keeper to start the server again",
    )
    assert again == {**info, "pid": again["pid"]}  # the same keeper, socket and URL
    with redis.Redis.from_url(info["url"], socket_timeout=5) as conn:
        assert wait_for(lambda: answers(conn), 10, "the server to answer") == b"1"
    wait_for(lambda: "answers again" in project.output(served), 10, "`queasy server` to see it")
    assert served.poll() is None, project.output(served)
    server_log = (project.data_dir / "server.log").read_text()
    assert "starting it again for the processes that use it" in server_log
    served.send_signal(signal.SIGTERM)
    assert served.wait(timeout=30) == 0, project.output(served)
    project.assert_gone(again)


def test_a_server_that_keeps_dying_is_given_up_after_keeper_restarts(project: Project) -> None:
    """A server that dies again at once (a crash on its data, the OOM killer each time) is
    not started for ever: after KEEPER_RESTARTS starts within KEEPER_RESTART_WINDOW the
    keeper stops, and `queasy server` exits 1 saying the server stopped answering."""
    served = project.start("server")
    info = wait_for(project.info, 30, "`queasy server` to start the server")
    wait_for(lambda: "serving" in project.output(served), 10, "the serving line")
    pid = info["pid"]
    for n in range(defaults.KEEPER_RESTARTS):
        os.kill(pid, signal.SIGKILL)
        pid = wait_for(
            lambda old=pid: (i := project.info()) is not None and i["pid"] != old and i["pid"],
            30, f"start {n + 1} again",
        )  # fmt: skip
    os.kill(pid, signal.SIGKILL)  # once more within the window: given up
    assert served.wait(timeout=30) == 1, project.output(served)
    assert "the embedded server stopped answering" in project.output(served)
    server_log = (project.data_dir / "server.log").read_text()
    assert f"not started again: it died {defaults.KEEPER_RESTARTS + 1} times" in server_log
    project.assert_gone({**info, "pid": pid})


def test_a_process_using_the_server_goes_on_after_it_died(project: Project) -> None:
    """A long-lived user of the server (a web app's Client, `queasy run`) whose server died
    waited as in an outage until some other queasy command started a new one; the keeper
    starts it again itself, so its next calls go through, nothing else run."""
    first = join(project.data_dir)
    project.pids.update((first.pid, first.keeper_pid))  # type: ignore[arg-type]
    try:
        with Client(first.url, workers=0) as client:
            q = client.queue("q")
            q.dispatch("before", id="a")
            os.kill(first.pid, signal.SIGKILL)  # type: ignore[arg-type]
            wait_for(lambda: dispatches(q), 30, "a dispatch after the server died")
            assert {j.id for j in q.jobs("waiting")[0]} >= {"a", "b"}  # a: from its AOF
    finally:
        assert first.close()


def answers(conn: redis.Redis) -> bytes | None:
    """The key 'kept' once the server answers, else None."""
    try:
        return conn.get("kept")
    except redis.ConnectionError:
        return None


def dispatches(q: Any) -> bool:
    """Whether a dispatch goes through (while the server is down: a QueasyError, also once
    the client had connected: ConnectionFailed, not redis-py's ConnectionError)."""
    try:
        q.dispatch("after", id="b")
    except QueasyError:
        return False
    return True


def test_queasy_server_with_a_config_that_cannot_be_read_exits_2_and_makes_nothing(
    project: Project,
) -> None:
    """`queasy server --config TYPO` made TYPO's directories, a .queasy/ there and served a
    server no other command would find, where every other command exits 2 on that file."""
    missing = project.dir / "typo" / "sub" / "pyproject.toml"
    try:
        done = subprocess.run(
            [QUEASY, "server", "--config", str(missing)], cwd=project.dir, env=project.env,
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=15,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise AssertionError("queasy server ran on a config file that does not exist") from None
    assert done.returncode == 2, done.stderr
    assert f"cannot read config {missing}" in done.stderr and "Traceback" not in done.stderr
    assert not (project.dir / "typo").exists()
    bad = project.dir / "bad.toml"
    bad.write_text("redis = \n")
    done = project.queasy("server", "--config", str(bad))
    assert done.returncode == 2 and f"malformed TOML in {bad}" in done.stderr, done.stderr
    assert not (project.dir / defaults.STATE_DIR_NAME).exists()


@pytest.mark.parametrize("given", [True, False], ids=["config_file", "project_pyproject"])
def test_queasy_server_refuses_a_config_that_names_another_redis(
    project: Project, given: bool
) -> None:
    """A config whose `redis` names a server: every other command of the project uses that
    server, so the embedded one `queasy server` served (and kept up) was used by none. It
    exits CONFIG (2) naming the file and the URL, its password masked, and makes nothing."""
    url = "redis://:hunter2@redis.example:6379/0"
    if given:
        config = project.dir / "queasy.toml"
        config.write_text(f'redis = "{url}"\n[queues.q]\nhandler = "app.jobs"\n')
        args = ["server", "--config", str(config)]
    else:
        config = project.dir / "pyproject.toml"
        config.write_text(PYPROJECT.replace("[tool.queasy]\n", f'[tool.queasy]\nredis = "{url}"\n'))
        args = ["server"]
    try:
        done = subprocess.run(
            [QUEASY, *args], cwd=project.dir, env=project.env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=15,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise AssertionError("queasy server served beside the config's redis") from None
    assert done.returncode == 2, done.stderr
    assert f"{config}: redis names redis://:***@redis.example:6379/0" in done.stderr, done.stderr
    assert "hunter2" not in done.stderr and "Traceback" not in done.stderr
    assert not project.data_dir.exists()


# ---------------------------------------------------------------- locked (issue #18)


def test_the_server_files_are_private_and_it_listens_on_no_tcp_port(project: Project) -> None:
    server = join(project.data_dir)
    try:
        mode = {
            name: os.stat(project.data_dir / name).st_mode for name in ("password", "server.json")
        }
        assert {name: stat.S_IMODE(m) for name, m in mode.items()} == dict.fromkeys(mode, 0o600)
        assert stat.S_IMODE(project.data_dir.stat().st_mode) == 0o700
        sock = os.stat(server.socket)
        assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o700
        proc = psutil.Process(server.pid)  # type: ignore[arg-type]
        assert proc.net_connections("inet") == []  # no TCP port, v4 or v6
        assert server.password not in " ".join(proc.cmdline())
        with redis.Redis(unix_socket_path=server.socket) as conn:  # no password: refused
            with pytest.raises(redis.AuthenticationError):
                conn.ping()
    finally:
        server.close()


def test_the_server_log_is_private_under_an_umask_of_000(project: Project) -> None:
    """server.log was opened by the process that started the keeper, with that process's
    umask: 0666 under `umask 000` (the README: the server's files are made with umask 077)."""
    old = os.umask(0)
    try:
        server = join(project.data_dir)
    finally:
        os.umask(old)
    try:
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in project.data_dir.iterdir()}
        assert modes["server.log"] == 0o600
        assert {name for name, mode in modes.items() if mode & 0o077} == set(), modes
    finally:
        server.close()


def test_another_local_user_cannot_reach_the_server(project: Project) -> None:
    if os.geteuid() != 0:
        pytest.skip("acting as another user (nobody) needs root")
    server = join(project.data_dir)
    try:
        for what in ("connect", "read"):
            child = os.fork()
            if child == 0:  # as nobody: no exec, so no interpreter to find
                code = 1
                try:
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                    if what == "connect":
                        socket.socket(socket.AF_UNIX).connect(server.socket)
                    else:
                        (project.data_dir / "password").read_bytes()
                    code = 0
                except PermissionError:
                    code = 13
                finally:
                    os._exit(code)
            _, status = os.waitpid(child, 0)
            assert os.waitstatus_to_exitcode(status) == 13, what
    finally:
        server.close()


def as_nobody(action: Callable[[], None]) -> None:
    """Run `action` in a child acting as user nobody (65534); fail if it raises."""
    child = os.fork()
    if child == 0:  # no exec, so no interpreter to find
        code = 1
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            action()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_data_dir_of_another_user_is_refused(project: Project) -> None:
    """Another account that made the data directory first (in a shared, world-writable
    place) owns it: it could read or swap the password, server.json and the socket. It was
    used as it was, with the password that account wrote there."""
    if os.geteuid() != 0:
        pytest.skip("acting as another user (nobody) needs root")
    with tempfile.TemporaryDirectory() as shared:  # like /tmp (pytest's tmp_path is 0700)
        os.chmod(shared, 0o1777)
        planted = Path(shared) / ".queasy"

        def plant() -> None:
            planted.mkdir(mode=0o700)
            (planted / "password").write_text("known-to-the-attacker\n")

        as_nobody(plant)
        done = project.queasy("dispatch", "q", "1", "--data-dir", str(planted))
        assert done.returncode == 2, done.stderr
        assert f"{planted} belongs to another user (uid 65534" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert sorted(p.name for p in planted.iterdir()) == ["password"]  # nothing made there


def test_parents_made_under_an_umask_of_000_are_not_writable_by_others(project: Project) -> None:
    """`umask 000` made the missing parents of a data dir 0777: another account could rename
    the 0700 data dir away and put its own in its place."""
    data_dir = project.dir / "deep" / "er" / ".queasy"
    old = os.umask(0)
    try:
        server = join(data_dir)
    finally:
        os.umask(old)
    try:
        for parent in (project.dir / "deep", project.dir / "deep" / "er"):
            assert stat.S_IMODE(parent.stat().st_mode) & 0o022 == 0, parent
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    finally:
        server.close()


# ---------------------------------------------------------------- one resolution order


def test_the_resolution_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    monkeypatch.delenv(defaults.URL_ENV, raising=False)
    monkeypatch.delenv(defaults.DATA_DIR_ENV, raising=False)
    (tmp_path / "pyproject.toml").write_text('[tool.queasy]\nredis = "redis://config:1/0"\n')
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    found = resolve()
    assert (found.url, found.server) == ("redis://config:1/0", None)
    assert found.source == f"`redis` of {tmp_path / 'pyproject.toml'}"
    monkeypatch.setenv(defaults.URL_ENV, "redis://env:2/0")
    assert resolve().url == "redis://env:2/0"
    flag = resolve("redis://flag:3/0", given="--redis")
    assert (flag.url, flag.source) == ("redis://flag:3/0", "--redis")
    monkeypatch.delenv(defaults.URL_ENV)
    other = tmp_path / "other.toml"
    other.write_text('redis = "redis://other:4/0"\n[queues.q]\nhandler = "x"\n')
    assert resolve(config=other).url == "redis://other:4/0"
    # the embedded server's directory: given, else $QUEASY_DATA_DIR, else next to the config
    assert data_dir_for(None, other) == tmp_path / ".queasy"
    assert data_dir_for() == tmp_path / ".queasy"  # the pyproject.toml found walking up
    monkeypatch.setenv(defaults.DATA_DIR_ENV, str(tmp_path / "env-dir"))
    assert data_dir_for(None, other) == tmp_path / "env-dir"
    assert data_dir_for(tmp_path / "given", other) == tmp_path / "given"


def test_dispatch_and_cancel_read_the_config_like_run(
    project: Project, redis_url: str, prefix: str
) -> None:
    (project.dir / "pyproject.toml").write_text(
        PYPROJECT.replace(
            "[tool.queasy]\n", f'[tool.queasy]\nredis = "{redis_url}"\nprefix = "{prefix}"\n'
        )
    )
    done = project.queasy("dispatch", "q", '"configured"', "--delay", "60")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert f"(from `redis` of {project.dir / 'pyproject.toml'})" in done.stderr
    with Client(redis_url, workers=0, prefix=prefix) as client:
        assert client.queue("q").get_job(job_id).data == "configured"  # type: ignore[union-attr]
    cancelled = project.queasy("cancel", "q", job_id, cwd=project.dir / "app")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == f"cancelled {job_id}"
    assert not project.data_dir.exists()  # no embedded server was started


def test_a_data_dir_that_cannot_be_made_is_a_config_error(project: Project) -> None:
    blocker = project.dir / "a-file"
    blocker.write_text("")
    done = project.queasy("dispatch", "q", "1", "--data-dir", str(blocker / "state"))
    assert done.returncode == 2, done.stderr
    assert f"cannot use {blocker / 'state'} as the embedded server's data directory" in done.stderr
    assert "--data-dir" in done.stderr and "Traceback" not in done.stderr


def test_a_keeper_that_cannot_write_server_json_says_why_and_stops_its_server(
    project: Project,
) -> None:
    """The keeper started its server, then could not write server.json (a full disk: ENOSPC;
    here a directory in its way). It died with a traceback, so join() said only "the
    embedded server's keeper failed: see server.log", a log the full disk had cut short; it
    now says `error` naming the file and the reason, and stops its server."""
    from queasy_py.store.datadir import lock_file, socket_path
    from queasy_py.store.embedded import find_server_binary

    project.data_dir.mkdir(mode=0o700)
    (project.data_dir / "server.json" / "in-the-way").mkdir(parents=True)
    lock = lock_file(project.data_dir / "keeper.lock")
    sock = socket_path(project.data_dir)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "queasy_py.store.keeper", str(project.data_dir),
             find_server_binary(), str(sock), str(lock)],
            env=project.env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=60, pass_fds=(lock,),
        )  # fmt: skip
    finally:
        os.close(lock)
    assert done.returncode == 1, done.stderr
    word, _, why = done.stdout.partition(" ")
    assert word == "error", done.stdout
    assert str(project.data_dir / "server.json") in json.loads(why)
    assert "Traceback" not in done.stderr
    assert not sock.exists()  # its server stopped (SHUTDOWN removes the socket)


def test_a_gitignore_a_full_disk_left_empty_is_written_again(project: Project) -> None:
    """A full disk made `.queasy/.gitignore` and left it empty (ENOSPC on its write); it was
    never written again (only its absence was checked), so `git add -A` took the password
    file and server.json into the project's repository."""
    project.data_dir.mkdir(mode=0o700)
    (project.data_dir / ".gitignore").write_text("")
    done = project.queasy("dispatch", "q", '"again"')
    assert done.returncode == 0, done.stderr
    assert "*" in (project.data_dir / ".gitignore").read_text().splitlines()


def test_a_deep_project_with_a_missing_xdg_runtime_dir_puts_its_socket_in_tmp(
    project: Project,
) -> None:
    """A data dir too long for a unix socket, with $XDG_RUNTIME_DIR naming a directory that
    does not exist (a `su` or container session inherits one): a FileNotFoundError traceback
    from socket_path used to end the command; the socket goes to /tmp/queasy-UID instead."""
    import tempfile

    deep = project.dir / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    (deep / "pyproject.toml").write_text(PYPROJECT)
    gone = Path(tempfile.mkdtemp())  # short: used if it existed
    gone.rmdir()
    project.env["XDG_RUNTIME_DIR"] = str(gone)
    done = project.queasy("dispatch", "q", '"deep"', cwd=deep)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert f"unix://:***@{tempfile.gettempdir()}/queasy-{os.getuid()}/" in done.stderr
    assert not gone.exists()
    if os.geteuid() == 0:  # one of another user (`su` keeps it): not used either
        theirs = Path(tempfile.mkdtemp())
        os.chown(theirs, 65534, 65534)
        project.env["XDG_RUNTIME_DIR"] = str(theirs)
        done = project.queasy("dispatch", "q", '"theirs"', cwd=deep)
        assert done.returncode == 0, done.stderr
        assert f"unix://:***@{tempfile.gettempdir()}/queasy-{os.getuid()}/" in done.stderr
        assert list(theirs.iterdir()) == []
        theirs.rmdir()


def test_the_async_client_uses_the_project_server_and_keeps_its_job(
    project: Project, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio

    from queasy_py.aio import AsyncClient

    monkeypatch.chdir(project.dir / "app")

    async def dispatch() -> tuple[Any, ...]:
        async with AsyncClient() as client:
            await client.queue("q").dispatch("async")
            assert client.server is not None
            return client.server.data_dir, client.server.pid, client.server.keeper_pid

    with caplog.at_level("INFO", logger="queasy_py"):
        data_dir, pid, keeper_pid = asyncio.run(dispatch())
    assert data_dir == project.data_dir
    assert f"using the embedded server of {project.data_dir}" in caplog.text
    project.assert_gone({"pid": pid, "keeper_pid": keeper_pid})  # stopped at its close
    with Client(workers=0) as client:  # the next one finds the job on disk
        assert client.server is not None and client.server.pid != pid
        assert client.queue("q").counts()["waiting"] == 1


# ---------------------------------------------------------------- its directory removed


def test_close_after_the_data_dir_was_removed_says_so_and_the_server_still_stops(
    project: Project, caplog: pytest.LogCaptureFixture
) -> None:
    """`rm -rf .queasy` under a live server: close() (a Client's, `queasy run`'s, at exit)
    raised FileNotFoundError from its lock files. It says what happened instead; the keeper,
    which still holds the removed users.lock, stops the server all the same."""
    import shutil

    server = join(project.data_dir)
    info = project.info()
    assert info is not None
    shutil.rmtree(project.data_dir)
    with caplog.at_level("WARNING", logger="queasy_py.embedded"):
        assert server.close() is False
    assert f"the data directory {project.data_dir} of the embedded server was removed" in (
        caplog.text
    )
    for key in ("pid", "keeper_pid"):
        wait_for(lambda pid=info[key]: pid_gone(pid), 15, f"{key} {info[key]} to exit")
    assert server.close() is False  # idempotent


def test_queasy_server_whose_data_dir_is_removed_exits_1_without_a_traceback(
    project: Project,
) -> None:
    import shutil

    served = project.start("server")
    info = wait_for(project.info, 30, "`queasy server` to start the server")
    wait_for(lambda: "serving" in project.output(served), 10, "the serving line")
    shutil.rmtree(project.data_dir)
    try:
        code = served.wait(timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError(project.output(served)) from None
    out = project.output(served)
    assert code == 1 and "Traceback" not in out, out
    assert f"the data directory {project.data_dir} of the embedded server was removed" in out
    for key in ("pid", "keeper_pid"):
        wait_for(lambda pid=info[key]: pid_gone(pid), 15, f"{key} {info[key]} to exit")
