"""Which Redis a client or a `queasy` command uses: one order, decided here only.

1. the URL given: `Client(url)`, `AsyncClient(url)`, `queasy ... --redis URL`;
2. `$QUEASY_REDIS_URL`;
3. the config file's `redis`: the file given (`queasy run CONFIG`, `--config FILE`,
   `Client(config=...)`), else the `[tool.queasy]` table of the project's `pyproject.toml` (the
   first one found walking up from the working directory);
4. the project's embedded server (store/shared.py), whose data directory is the one given
   (`--data-dir`, `Client(data_dir=...)`), else `$QUEASY_DATA_DIR`, else `.queasy/` next to the
   config file (the given one, else the project's `pyproject.toml`, with or without a
   `[tool.queasy]` table), else `$XDG_STATE_HOME/queasy/default` (`~/.local/state/...`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import defaults
from .errors import ConfigError
from .store.connection import mask_url

if TYPE_CHECKING:  # imported when needed: a client given a URL (a worker's) does without them
    from .store.shared import SharedServer

__all__ = ["Target", "config_table", "data_dir_for", "find_pyproject", "resolve"]

log = logging.getLogger("queasy_py")

PathLike = str | os.PathLike[str]


@dataclass
class Target:
    """The server a client uses: its URL (holding any password: log `describe()`), where the URL
    came from (`explicit`: given as an argument or flag), and the embedded server this process
    joined (None for a URL from elsewhere)."""

    url: str
    source: str
    server: SharedServer | None = None
    explicit: bool = False

    def describe(self) -> str:
        if self.server is None:
            return f"Redis at {mask_url(self.url)} (from {self.source})"
        how = "started by this process" if self.server.started else "already running"
        return (
            f"the embedded server of {self.server.data_dir} at {mask_url(self.url)} "
            f"(valkey {self.server.version}, {how}; no Redis URL given)"
        )


def find_pyproject(start: PathLike | None = None) -> Path | None:
    """The first `pyproject.toml` in `start` (default: the working directory) or above it."""
    here = Path(start if start is not None else os.getcwd()).absolute()
    for directory in (here, *here.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def config_table(path: PathLike) -> dict[str, Any]:
    """The queasy settings of a config file: a pyproject.toml's `[tool.queasy]` table ({} if it
    has none), else the whole file. ConfigError names a file that cannot be read or parsed."""
    import tomllib

    file = Path(path)
    try:
        raw = tomllib.loads(file.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config {file}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"malformed TOML in {file}: {exc}") from None
    if file.name == "pyproject.toml":
        tool = raw.get("tool", {})
        if not isinstance(tool, dict):
            raise ConfigError(f"{file}: tool must be a table")
        raw = tool.get("queasy", {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: [tool.queasy] must be a table")
    return raw


def data_dir_for(explicit: PathLike | None = None, config: PathLike | None = None) -> Path:
    """The embedded server's data directory (step 4 of the module's order)."""
    chosen = explicit or os.environ.get(defaults.DATA_DIR_ENV)
    if chosen:
        return Path(chosen).expanduser().absolute()
    file = Path(config) if config is not None else find_pyproject()
    if file is not None:
        return file.absolute().parent / defaults.STATE_DIR_NAME
    from .store.embedded import state_dir

    return state_dir() / "default"


def resolve(
    url: str | None = None,
    *,
    config: PathLike | None = None,
    data_dir: PathLike | None = None,
    given: str = "the url argument",
) -> Target:
    """The server to use, in the module's order; `given` names where `url` came from. Joining
    the embedded server starts it if it does not run: `Target.server.close()` leaves it."""
    if url:
        return Target(url, given, explicit=True)
    env = os.environ.get(defaults.URL_ENV)
    if env:
        return Target(env, f"${defaults.URL_ENV}")
    file = Path(config) if config is not None else find_pyproject()
    if file is not None:
        value = config_table(file).get("redis")
        if value is not None:
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{file}: redis: must be a Redis URL string")
            return Target(value, f"`redis` of {file}")
    from .store.shared import join

    server = join(data_dir_for(data_dir, file))
    return Target(server.url, "embedded", server)
