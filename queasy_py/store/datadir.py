"""The private files of an embedded server's data directory (store/embedded.py, shared.py):
the directory itself (0700), its password, its log, its lock files, the path of its unix
socket, its `server.json` and its `.gitignore`."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pathlib
import secrets
import stat
import tempfile
import time
from typing import Any

from ..defaults import DATA_DIR_ENV
from ..errors import ConfigError, QueasyError

#: the longest unix socket path used as is (the kernel's limit is 107 bytes)
_MAX_SOCKET_PATH = 100
INFO = "server.json"


def lock_file(path: pathlib.Path) -> int:
    """An fd of the lock file `path` (created 0600), for flock; never follows a symlink."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def try_lock(fd: int, kind: int) -> bool:
    """flock(fd, kind) without waiting: True if taken."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def wait_lock(fd: int, kind: int, deadline: float, what: str) -> None:
    """flock(fd, kind), polling until `deadline` (time.monotonic()), then QueasyError."""
    while not try_lock(fd, kind):
        if time.monotonic() > deadline:
            raise QueasyError(f"timed out waiting for {what}")
        time.sleep(0.01)


def socket_path(data_dir: pathlib.Path) -> pathlib.Path:
    """Where the server of `data_dir` listens: `data_dir/valkey.sock`, or for a path too long
    for a unix socket, a file named by a hash of `data_dir` in a private directory of this user."""
    path = data_dir / "valkey.sock"
    if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
        return path
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    # one that is not a directory of this user (a `su` or container session inherits a missing
    # one, or another user's) is not used
    base = pathlib.Path(runtime) / "queasy" if runtime and _own_dir(runtime) else None
    if base is None or len(os.fsencode(base)) > _MAX_SOCKET_PATH - 25:
        base = pathlib.Path(tempfile.gettempdir()) / f"queasy-{os.getuid()}"
    try:
        base.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise QueasyError(f"cannot make {base} for the socket of {data_dir}: {exc}") from None
    info = os.lstat(base)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise QueasyError(f"{base} is not a directory of this user: cannot put a socket there")
    if info.st_mode & 0o077:
        os.chmod(base, 0o700)
    return base / f"{hashlib.sha256(os.fsencode(data_dir)).hexdigest()[:16]}.sock"


def _own_dir(path: str) -> bool:
    """True if `path` is a directory (not a link) of this user."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


def read_info(data_dir: pathlib.Path) -> dict[str, Any] | None:
    """The running server's `server.json`, None if missing or unreadable."""
    try:
        info = json.loads((data_dir / INFO).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("url"), str) else None


def ignore_file(data_dir: pathlib.Path) -> None:
    """A `.gitignore` of `*`, so the state directory is never committed: written whole (a
    temporary file renamed) when missing or empty (a full disk left it so), else kept."""
    ignore = data_dir / ".gitignore"
    try:
        if ignore.stat().st_size > 0:
            return
    except FileNotFoundError:
        pass
    fd, temp = tempfile.mkstemp(prefix=".gitignore.", dir=data_dir)
    try:
        with os.fdopen(fd, "w") as out:
            out.write("# made by queasy_py: the embedded server's data and password\n*\n")
        os.replace(temp, ignore)
    except BaseException:
        os.unlink(temp)
        raise


def private_dir(path: pathlib.Path) -> None:
    """Create `path` (and parents) if missing; make it 0700: it holds job data and passwords.

    Parents it makes are 0755 at most, whatever the umask (`umask 000` made them 0777: any
    local account could then swap `path` for a directory of its own). A `path` (or the target
    of a link there) of another user is a ConfigError: its owner could read or replace the
    password, `server.json` and the socket (root using a directory another account made)."""
    missing = []
    parent = path.parent
    while not os.path.lexists(parent):
        missing.append(parent)
        parent = parent.parent
    for made in reversed(missing):
        made.mkdir(mode=0o755, exist_ok=True)
    path.mkdir(exist_ok=True, mode=0o700)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise ConfigError(
            f"{path} belongs to another user (uid {info.st_uid}, this process runs as uid "
            f"{os.getuid()}): it would hold this user's server password, socket and job data "
            f"where that user can read or replace them; use a directory of this user "
            f"(--data-dir, ${DATA_DIR_ENV})"
        )
    if info.st_mode & 0o077:
        path.chmod(0o700)


def stored_password(data_dir: pathlib.Path) -> str:
    """The password kept in `data_dir/password`, created (0600, random) if missing."""
    file = data_dir / "password"
    try:
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        password = file.read_text().strip()
        if password:
            return password
        file.unlink()  # empty (a crash mid-write): make a new one
        return stored_password(data_dir)
    password = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as out:
        out.write(password + "\n")
    return password


def write_private(file: pathlib.Path, text: str) -> pathlib.Path:
    """Write `text` to `file`, readable by this user only (0600 from its creation)."""
    file.unlink(missing_ok=True)
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return file


def open_log(file: pathlib.Path) -> int:
    """An fd appending to the log `file`, made 0600 whatever the umask (it names paths and
    pids; never a password)."""
    fd = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return fd
