"""A project's embedded server: one durable valkey-server per data directory, shared by every
queasy process that uses the directory, stopped when the last of them is gone.

`join(data_dir)` returns a `SharedServer` for the server of that directory, starting it if none
runs; `SharedServer.close()` stops using it. The directory (0700) holds:

- `password`: the server's password (0600), made the first time;
- `server.json` (0600), there while it runs: `url` (holding the password), `socket`, `pid`,
  `keeper_pid`, `version`;
- `valkey.sock`: the unix socket (0700; no TCP port); when that path is too long for a socket,
  `<$XDG_RUNTIME_DIR/queasy or /tmp/queasy-UID>/<hash of the dir>.sock` (a 0700 dir);
- `appendonlydir/`: the data (append-only file, fsync every second); `server.log`: the log of
  the server and its keeper;
- `start.lock`: held while a process starts, joins or stops the server (by the keeper it
  starts too, until that is ready: a starter killed mid-start leaves it held till then);
- `keeper.lock`: held by the keeper while it lives: free means no server, whatever the other
  files say;
- `users.lock`: held shared by every process using the server.

The server runs under a keeper (`queasy_py/store/keeper.py`, a session of its own, so a
terminal's Ctrl-C does not reach it), its parent, which it dies with (PR_SET_PDEATHSIG), even by
SIGKILL. The keeper tries to take `users.lock` exclusively every `KEEPER_POLL_INTERVAL`: once it
can, no process uses the server (the kernel releases the lock of a process that exits, even by
SIGKILL), and it shuts the server down (the append-only file flushed and fsynced) and exits.
A start after a SIGKILL of the keeper finds `keeper.lock` free and replaces the stale files; one
that finds a keeper whose server no longer listens (it died; the keeper notices within
KEEPER_POLL_INTERVAL) waits for that keeper to exit, then starts a new one.
Locks are taken in one order: `start.lock` first.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import pathlib
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import Any
from urllib.parse import unquote, urlsplit

from .. import defaults
from ..errors import ConfigError, QueasyError
from .datadir import (
    INFO,
    ignore_file,
    lock_file,
    open_log,
    private_dir,
    read_info,
    socket_path,
    try_lock,
    wait_lock,
)
from .embedded import find_server_binary
from .resp import ping_answer

__all__ = ["SharedServer", "join", "serve_foreground", "socket_path"]

log = logging.getLogger("queasy_py.embedded")


class SharedServer:
    """This process's use of the server of `data_dir` (its `users.lock` held shared).

    `url` holds the password: log it through mask_url. `started` is True in the process
    whose join() started it. `long_lived` (set by a supervisor) turns the WARNING logged when
    this process was the last to use it into an INFO line."""

    def __init__(
        self,
        data_dir: pathlib.Path,
        info: dict[str, Any],
        users: int,
        started: bool,
    ) -> None:
        self.data_dir = data_dir
        self.url: str = info["url"]
        self.socket: str = str(info.get("socket", ""))
        self.pid: int | None = info.get("pid")
        self.keeper_pid: int | None = info.get("keeper_pid")
        self.version: str = str(info.get("version", ""))
        self.started = started
        self.long_lived = False
        self._users: int | None = users
        atexit.register(self.close)

    @property
    def password(self) -> str:
        return unquote(urlsplit(self.url).password or "")

    def __repr__(self) -> str:
        return f"<SharedServer {self.socket} pid={self.pid} data_dir={str(self.data_dir)!r}>"

    def close(self, timeout: float = defaults.EMBEDDED_START_TIMEOUT) -> bool:
        """Stop using the server; idempotent. When no other process uses it, the keeper stops
        it: wait for that (bounded by `timeout`) and return True."""
        users, self._users = self._users, None
        if users is None:
            return False
        atexit.unregister(self.close)
        os.close(users)
        try:
            stopped = _wait_stopped(self.data_dir, time.monotonic() + timeout)
        except FileNotFoundError:  # `rm -rf .queasy` under it: no lock file to wait on
            log.warning("%s; not waiting for it to stop", _removed(self.data_dir))
            return False
        if stopped and self.long_lived:
            log.info("stopped the embedded server of %s: no other process uses it", self.data_dir)
        elif stopped:
            log.warning(
                "the embedded server of %s stopped with this process, the only one using it: "
                "its jobs are kept there (append-only file) and run by the next `queasy run` "
                "using that directory",
                self.data_dir,
            )
        return stopped


def _removed(data_dir: pathlib.Path) -> str:
    """What a process says when the data directory of the server it uses is gone."""
    return (
        f"the data directory {data_dir} of the embedded server was removed while it ran (its "
        "socket, password and append-only file with it: its jobs are lost); the server stops "
        "once no process uses it"
    )


def _wait_stopped(data_dir: pathlib.Path, deadline: float) -> bool:
    """After this process released `users.lock`: True once the keeper has stopped the server
    because no process uses it; False at once if another process still uses it.

    `users.lock` is only ever taken exclusively under `start.lock` (here and by the keeper), so
    a failed try under `start.lock` means a process that uses the server."""
    fds = [lock_file(data_dir / name) for name in ("start.lock", "users.lock", "keeper.lock")]
    start, users, keeper = fds
    try:
        while True:
            if try_lock(start, fcntl.LOCK_EX):
                try:
                    if try_lock(keeper, fcntl.LOCK_EX):  # no keeper: stopped; let go of it
                        fcntl.flock(keeper, fcntl.LOCK_UN)  # before start.lock (join() next)
                        return True
                    if not try_lock(users, fcntl.LOCK_EX):
                        return False  # another process uses it
                    fcntl.flock(users, fcntl.LOCK_UN)
                finally:
                    fcntl.flock(start, fcntl.LOCK_UN)
            if time.monotonic() > deadline:
                log.warning("the embedded server of %s has not stopped yet", data_dir)
                return False
            time.sleep(0.01)
    finally:
        for fd in fds:
            os.close(fd)


def join(
    data_dir: str | os.PathLike[str], timeout: float = defaults.EMBEDDED_START_TIMEOUT
) -> SharedServer:
    """Use the server of `data_dir` (made 0700 if missing), starting it if none runs."""
    path = pathlib.Path(data_dir).absolute()
    try:
        private_dir(path)
        ignore_file(path)
        start = lock_file(path / "start.lock")
    except OSError as exc:
        raise ConfigError(
            f"cannot use {path} as the embedded server's data directory ({exc}); choose "
            f"another with --data-dir or ${defaults.DATA_DIR_ENV}, or give a Redis URL"
        ) from None
    deadline = time.monotonic() + timeout
    try:
        while True:
            wait_lock(start, fcntl.LOCK_EX, deadline, f"the embedded server of {path} to start")
            joined = _join_locked(path, start, deadline)
            if joined is not None:
                break
            # its server died, its keeper has not noticed yet: under start.lock, it starts it
            # again (processes use it) or stops
            fcntl.flock(start, fcntl.LOCK_UN)
            if time.monotonic() > deadline:
                raise QueasyError(
                    f"the embedded server of {path} died and its keeper has neither started "
                    f"it again nor exited (see {path / 'server.log'})"
                )
            time.sleep(defaults.KEEPER_POLL_INTERVAL / 2)
    finally:
        os.close(start)
    info, users, started = joined
    return SharedServer(path, info, users, started)


def _join_locked(
    path: pathlib.Path, start: int, deadline: float
) -> tuple[dict[str, Any], int, bool] | None:
    """join() under start.lock (`start`): server.json, the fd of users.lock (held shared) and
    whether this process started the server; None when a keeper lives but nothing listens on
    its socket any more (its server died; the keeper notices within KEEPER_POLL_INTERVAL)."""
    keeper_lock = lock_file(path / "keeper.lock")
    users = lock_file(path / "users.lock")
    try:
        started = False
        if try_lock(keeper_lock, fcntl.LOCK_EX):  # no keeper alive: start one
            for stale in (path / INFO, socket_path(path)):
                stale.unlink(missing_ok=True)
            wait_lock(users, fcntl.LOCK_SH, deadline, f"{path / 'users.lock'}")
            _start_keeper(path, keeper_lock, start, deadline)
            started = True
        else:
            wait_lock(users, fcntl.LOCK_SH, deadline, f"{path / 'users.lock'}")
        info = read_info(path)
        if info is None:
            raise QueasyError(
                f"the embedded server of {path} has a keeper (see {path / 'server.log'}) "
                f"but no readable {INFO}"
            )
        if not started and not _listening(str(info.get("socket", ""))):
            os.close(users)
            return None
    except BaseException:
        os.close(users)
        raise
    finally:
        os.close(keeper_lock)  # a started keeper holds the lock through its own copy
    return info, users, started


def _listening(path: str) -> bool:
    """False when nothing listens on the unix socket `path` (refused, or no such file); a
    frozen server, whose backlog still takes the connection, is listening."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:
            return True
    return True


def _start_keeper(data_dir: pathlib.Path, keeper_lock: int, start: int, deadline: float) -> None:
    """Run the keeper (handing it `keeper_lock`); return once it says its server answers.

    A shell starts it in the background and exits at once, so the keeper is no child of this
    process: nothing to reap here, and it lives on when this process exits while others use
    the server. It also gets `start` (start.lock, held here: the same open file, so the same
    lock), which it lets go of once it is ready or has failed: killed mid-start, this process
    leaves start.lock held until then, and the next to join finds a server or no keeper, never
    a keeper without a server.json."""
    package_root = str(pathlib.Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    args = [
        "/bin/sh", "-c", 'exec "$@" </dev/null &', "queasy-keeper",
        sys.executable, "-m", "queasy_py.store.keeper",
        str(data_dir), find_server_binary(), str(socket_path(data_dir)), str(keeper_lock),
        str(start),
    ]  # fmt: skip
    with os.fdopen(open_log(data_dir / "server.log"), "ab") as log_file:
        try:
            shell = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log_file,
                cwd=data_dir,
                env=env,
                pass_fds=(keeper_lock, start),
                start_new_session=True,
            )
        except OSError as exc:
            raise QueasyError(f"cannot run the embedded server's keeper: {exc}") from exc
    shell.wait()
    assert shell.stdout is not None
    with shell.stdout:
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([shell.stdout], [], [], remaining)[0]:
                # the keeper, still starting, finds no one using its server once ready
                raise QueasyError(f"the embedded server of {data_dir} did not start in time")
            chunk = os.read(shell.stdout.fileno(), 4096)
            if not chunk:
                break
            line += chunk
    if line.startswith(b"ready"):
        return
    try:
        why = json.loads(line.partition(b" ")[2]) if line.startswith(b"error ") else None
    except ValueError:
        why = None
    raise QueasyError(why or f"the embedded server's keeper failed: see {data_dir / 'server.log'}")


def _keeper_alive(data_dir: pathlib.Path) -> bool:
    """False once no keeper of `data_dir` lives (it exits when its server dies); True while
    one does, or while start.lock is held (a start or a stop under way: asked again later).
    `keeper.lock` is tried under start.lock, as join() does."""
    start, keeper = (lock_file(data_dir / name) for name in ("start.lock", "keeper.lock"))
    try:
        if not try_lock(start, fcntl.LOCK_EX):
            return True
        try:
            if try_lock(keeper, fcntl.LOCK_EX):  # let go before start.lock: a join() next
                fcntl.flock(keeper, fcntl.LOCK_UN)  # must find it free
                return False
            return True
        finally:
            fcntl.flock(start, fcntl.LOCK_UN)
    finally:
        os.close(keeper)
        os.close(start)


def serve_foreground(data_dir: str | os.PathLike[str]) -> int:
    """`queasy server`: use (starting it if needed) the server of `data_dir` until SIGTERM or
    SIGINT, logging where it listens; then leave it, which stops it unless other processes
    use it. Return the exit code."""
    if not logging.getLogger().hasHandlers():
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server = join(data_dir)
        server.long_lived = True
        try:
            log.info(
                "serving the embedded server of %s on unix socket %s (valkey %s, pid %s, "
                "no TCP port); the URL with its password is in %s (readable by this user "
                "only); stop with Ctrl-C or SIGTERM",
                server.data_dir, server.socket, server.version, server.pid,
                server.data_dir / INFO,
            )  # fmt: skip
            return _watch_served(server, stopping)
        finally:
            if not server.close():
                log.info("left the embedded server: other processes still use it")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _watch_served(server: SharedServer, stopping: threading.Event) -> int:
    """`queasy server` until `stopping`: say when its server refuses commands (MISCONF: a
    full disk), stops answering (busy or paused) and answers again; 1 once it is dead or its
    data directory is gone, else 0."""
    state = "answers"
    while not stopping.wait(0.5):
        answer = ping_answer(server.socket, server.password)
        if answer == "PONG":
            if state != "answers":
                log.info("the embedded server answers again")
            state = "answers"
        elif answer is not None:  # an error: it refuses every command, PING included
            if state != answer:
                log.error("the embedded server refuses commands: %s (see %s)",
                          answer, server.data_dir / "server.log")  # fmt: skip
            state = answer
        elif not server.data_dir.is_dir():
            log.error("%s", _removed(server.data_dir))
            return 1
        elif _keeper_alive(server.data_dir):  # busy or paused, not dead: its keeper
            if state != "silent":  # watches it (and exits when it dies)
                log.warning(
                    "the embedded server does not answer PING (busy, paused, or being started "
                    "again after it died?)"
                )
            state = "silent"
        else:
            log.error("the embedded server stopped answering; see %s",
                      server.data_dir / "server.log")  # fmt: skip
            return 1
    return 0
