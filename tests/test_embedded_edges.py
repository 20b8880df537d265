"""The project's embedded server at its edges: project paths a URL would misread, a process
killed while it starts the server. Real `queasy` subprocesses and servers; bounded waits.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from test_embedded_shared import PYPROJECT, Project, pid_gone, project, wait_for

from queasy_py.store.shared import join

__all__ = ["project"]  # the fixture, imported

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("QUEASY_TEST_REDIS_URL")), reason="tests the embedded server itself"
)


def test_a_project_path_holding_url_characters_reaches_its_server(project: Project) -> None:
    """A project in `~/work/R&D #2 @home/50%41` (a `#`, `?`, `@` or `%` in its path): the
    server's URL put the socket path in unencoded, so `#` ended it as a fragment, `?` as a
    query, `%41` was read as `A` and an `@` as the end of the credentials: every command
    failed to connect (or refused the URL) on a server it had just started."""
    # short enough for its socket to sit in it (a longer path puts it under a hash in /tmp)
    weird = Path(tempfile.mkdtemp(prefix="R&D #2 ?x @home 50%41 ü-"))
    try:
        (weird / "pyproject.toml").write_text(PYPROJECT)
        done = project.queasy("dispatch", "q", '"odd"', "--id", "odd-1", cwd=weird)
        assert done.returncode == 0, done.stderr
        listed = project.queasy("jobs", "q", "--json", cwd=weird)
        assert listed.returncode == 0, listed.stderr
        assert '"id":"odd-1"' in listed.stdout
    finally:
        shutil.rmtree(weird)


def keeper_of(data_dir: Path) -> int | None:
    """The pid of the keeper process of `data_dir`, once it runs (read from /proc: fast)."""
    want = [b"queasy_py.store.keeper", os.fsencode(data_dir)]
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except (OSError, ValueError):
            continue
        if all(w in args for w in want):
            return int(entry)
    return None


JOINER = """
import sys, time
from queasy_py.store.shared import join
join(sys.argv[1])
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_process_killed_while_it_starts_the_server_leaves_the_next_one_a_live_server(
    project: Project,
) -> None:
    """A process starting the project's server (its keeper launched, not yet ready) is killed
    (SIGKILL, the OOM killer, a Ctrl-C'd `queasy run` of a terminal closing): the kernel let
    go of its start.lock, so a process starting next found a live keeper but no server.json,
    and failed ("has a keeper but no readable server.json"); the keeper, unable to say
    `ready` to the dead one, died on a BrokenPipeError and took its server along. The keeper
    now holds start.lock until it is ready, and goes on when no one hears it."""
    starter = subprocess.Popen(
        [sys.executable, "-c", JOINER, str(project.data_dir)],
        env=project.env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    keeper = None
    try:
        keeper = wait_for(lambda: keeper_of(project.data_dir), 30, "the keeper to start")
        os.kill(keeper, signal.SIGSTOP)  # mid-start: held there while its starter dies
        project.pids.add(keeper)
        assert not (project.data_dir / "server.json").exists(), "the keeper started too fast"
        starter.kill()
        starter.wait(timeout=30)
        thaw = threading.Timer(1.0, os.kill, (keeper, signal.SIGCONT))
        thaw.start()
        try:
            server = join(project.data_dir)
        finally:
            thaw.join()
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait(timeout=30)
        if keeper is not None and not pid_gone(keeper):
            os.kill(keeper, signal.SIGCONT)
    project.pids.update((server.pid, server.keeper_pid))  # type: ignore[arg-type]
    try:
        with redis.Redis.from_url(server.url, socket_timeout=5) as conn:
            assert conn.set("kept", "1")
    finally:
        assert server.close()
    project.assert_gone({"pid": server.pid, "keeper_pid": server.keeper_pid})
    assert "Traceback" not in (project.data_dir / "server.log").read_text()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (mounting needs root), unmounted after the test."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        pytest.skip("mounting a small tmpfs needs root on Linux")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(disk)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)


def fill(disk: Path) -> Path:
    """Write a file until the disk is full; return it."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def test_queasy_server_on_a_full_disk_says_what_the_server_answers(
    project: Project, small_disk: Path
) -> None:
    """The data directory's disk fills up: the server refuses writes, and PING too, with
    `MISCONF Errors writing to the AOF file: No space left on device`, which every command
    shows; `queasy server` said only "does not answer PING (busy or paused?)", sending its
    operator after a frozen process. It says what the server answers, and when it answers
    again (the disk freed: the server writes its append-only file again by itself)."""
    data_dir = small_disk / ".queasy"
    served = project.start("server", "--data-dir", str(data_dir))
    wait_for(lambda: "serving" in project.output(served), 30, "the serving line")
    info = json.loads((data_dir / "server.json").read_text())
    project.pids.update((info["pid"], info["keeper_pid"]))
    filler = fill(small_disk)
    with redis.Redis.from_url(info["url"], socket_timeout=5) as conn:
        with pytest.raises(redis.ResponseError):  # the write fails, or the next: MISCONF
            for i in range(100):
                conn.set(f"k{i}", "x" * 1024)
    wait_for(lambda: "No space left on device" in project.output(served), 10, "the MISCONF")
    out = project.output(served)
    assert "ERROR the embedded server refuses commands: MISCONF" in out, out
    assert "does not answer PING" not in out
    filler.unlink()
    wait_for(lambda: "answers again" in project.output(served), 15, "the server to recover")
    served.send_signal(signal.SIGTERM)
    assert served.wait(timeout=30) == 0, project.output(served)
    assert info["url"].split("@")[0].rsplit(":", 1)[1] not in project.output(served)
