"""The keeper of a project's shared embedded server (see store/shared.py).

    python -m queasy_py.store.keeper DATA_DIR SERVER_BINARY SOCKET_PATH KEEPER_LOCK_FD [START_FD]

Started by `shared.join()` in a session of its own, holding `keeper.lock` (the inherited fd) for
its whole life, and its starter's `start.lock` (START_FD) until it is ready or has failed, so a
starter killed meanwhile leaves no keeper without a server.json to the next process. It runs
valkey-server (durable, on the unix socket only) as its child, which dies with it
(PR_SET_PDEATHSIG), writes `server.json`, says `ready` on stdout (or
`error <JSON message>`), then checks every KEEPER_POLL_INTERVAL whether any process still holds
`users.lock`. When none does, or on SIGTERM, it shuts the server down (SHUTDOWN: the
append-only file is flushed and fsynced), removes `server.json` and exits. A server that dies
while processes use it (the OOM killer, a crash) is started again on the same socket with the
same password and data, under `start.lock`, so they reconnect as after any outage: at most
KEEPER_RESTARTS times within KEEPER_RESTART_WINDOW seconds, then it stops as when none uses
it. Its log lines go to stderr, the data dir's `server.log`. It imports no redis-py: it
starts fast.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import pathlib
import signal
import sys
import threading
import time
from types import FrameType

from .. import defaults
from ..errors import QueasyError
from .datadir import lock_file, try_lock, wait_lock, write_private
from .embedded import EmbeddedServer

log = logging.getLogger("queasy_py.keeper")


def _watch(server: EmbeddedServer, start: int, users: int, stop: threading.Event) -> str:
    """Wait until the server should stop; return why (starting with "valkey-server exited" when
    it died by itself). Holds start.lock when it returns (after SIGTERM: if it could)."""
    while not stop.wait(defaults.KEEPER_POLL_INTERVAL):
        proc = server._proc
        if proc is None or proc.poll() is not None:
            code = None if proc is None else proc.returncode
            wait_lock(start, fcntl.LOCK_EX, time.monotonic() + 30.0, "start.lock")
            return f"{DIED} (code {code}):\n{server._log_tail(0)}"
        if try_lock(start, fcntl.LOCK_EX):
            if try_lock(users, fcntl.LOCK_EX):
                return "no process uses it"
            fcntl.flock(start, fcntl.LOCK_UN)
    try:  # SIGTERM: let a process joining right now finish first, then stop all the same
        wait_lock(start, fcntl.LOCK_EX, time.monotonic() + 5.0, "start.lock")
    except QueasyError:
        pass
    return "SIGTERM"


DIED = "valkey-server exited unexpectedly"


def _restart(server: EmbeddedServer, users: int, why: str, restarts: list[float]) -> str | None:
    """Start the server that died (`why`, under start.lock) again when processes still use it
    and it died fewer than KEEPER_RESTARTS times in the last KEEPER_RESTART_WINDOW seconds
    (`restarts`: when it was started again); None once it answers, else why it stays down."""
    if try_lock(users, fcntl.LOCK_EX):
        return why  # none uses it: it stops as it would have
    now = time.monotonic()
    restarts[:] = [t for t in restarts if now - t < defaults.KEEPER_RESTART_WINDOW]
    if len(restarts) >= defaults.KEEPER_RESTARTS:
        return (
            f"{why}\nnot started again: it died {len(restarts) + 1} times within "
            f"{defaults.KEEPER_RESTART_WINDOW:g} s"
        )
    log.error("%s\nstarting it again for the processes that use it", why)
    restarts.append(now)
    try:
        server.start()
    except (QueasyError, OSError) as exc:
        return f"{why}\nand could not be started again: {exc}"
    log.info("valkey-server started again (pid %s)", server.pid)
    return None


def _say(*words: str) -> bool:
    """Tell the starter (stdout, a pipe) how the start went; False if it no longer reads."""
    try:
        print(*words, flush=True)
        return True
    except BrokenPipeError:
        return False


def main(argv: list[str]) -> int:
    data_dir, binary, socket = pathlib.Path(argv[0]), argv[1], argv[2]
    keeper_lock, starting = int(argv[3]), (int(argv[4]) if len(argv) > 4 else None)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s queasy keeper[%(process)d] %(levelname)s %(message)s",
    )
    os.umask(0o077)  # the server's files (its data, its log) are this user's only
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    server = EmbeddedServer(data_dir=data_dir, binary=binary, unix_socket=socket, durable=True)
    try:
        server.start()
    except (QueasyError, OSError) as exc:  # OSError: the password file (a full disk)
        _say("error", json.dumps(str(exc)))
        return 1
    info = {
        "url": server.url,
        "socket": socket,
        "pid": server.pid,
        "keeper_pid": os.getpid(),
        "version": server.version,
        "data_dir": str(data_dir),
    }
    info_file = data_dir / "server.json"
    try:
        write_private(info_file, json.dumps(info, indent=1) + "\n")
    except OSError as exc:  # a full disk, an unwritable data dir: said to join(), not just logged
        server.stop(timeout=10.0)
        with contextlib.suppress(OSError):
            info_file.unlink(missing_ok=True)  # what was written of it
        _say("error", json.dumps(f"cannot write {info_file}: {exc}"))
        return 1
    start, users = lock_file(data_dir / "start.lock"), lock_file(data_dir / "users.lock")
    if not _say("ready"):  # its starter was killed or gave up: the server serves whoever
        log.info("the process that started the server is gone")  # joins; or stops below
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    if starting is not None:  # start.lock: free once the starter lets go too (or is gone)
        os.close(starting)
    restarts: list[float] = []
    while True:
        why = _watch(server, start, users, stop)  # returns holding start.lock
        if not why.startswith(DIED):
            break
        down = _restart(server, users, why, restarts)
        if down is not None:
            why = down
            break
        try:  # its new pid, for whoever joins next
            write_private(info_file, json.dumps({**info, "pid": server.pid}, indent=1) + "\n")
        except OSError as exc:
            why = f"{why}\nstarted again, but cannot write {info_file}: {exc}"
            break
        fcntl.flock(start, fcntl.LOCK_UN)
    log.info("stopping valkey-server (pid %s): %s", server.pid, why)
    server.stop(timeout=10.0)
    info_file.unlink(missing_ok=True)
    pathlib.Path(socket).unlink(missing_ok=True)
    os.close(keeper_lock)  # first: a process that takes start.lock next sees no keeper
    os.close(users)
    os.close(start)
    return 1 if why.startswith(DIED) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
