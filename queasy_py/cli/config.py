"""`queasy run` configuration: a TOML file, or [tool.queasy] of ./pyproject.toml.

redis = "redis://127.0.0.1:6379/0"   # optional; default: $QUEASY_REDIS_URL, else embedded
workers = 2
heartbeat_interval = 5.0             # any key of defaults.SUPERVISOR
[queues.emails]
handler = "myapp.handlers.email"     # plus any keyword of Queue.listen()
size = 10
[queues.emails.fail_options]
max_retries = 50
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import defaults
from ..errors import ConfigError, InvalidInput
from ..options import ListenOptions, check_setting
from ..validate import queue_name

TOP_LEVEL = {"redis", "queues", "prefix"} | set(defaults.SUPERVISOR)


@dataclass
class Config:
    source: str
    redis: str | None = None
    prefix: str = defaults.PREFIX
    settings: dict[str, Any] = field(default_factory=dict)
    queues: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)


def read(path: str | None) -> Config:
    """Parse and check a config file. ConfigError names the file and the offending key."""
    if path is None:
        file = Path("pyproject.toml")
        if not file.is_file():
            raise ConfigError("no config file given and no ./pyproject.toml with [tool.queasy]")
    else:
        file = Path(path)
    try:
        raw = tomllib.loads(file.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config {file}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"malformed TOML in {file}: {exc}") from None
    if file.name == "pyproject.toml":
        raw = raw.get("tool", {}).get("queasy")
        if raw is None:
            raise ConfigError(f"{file} has no [tool.queasy] table")
    return parse(raw, str(file))


def parse(raw: dict[str, Any], source: str) -> Config:
    def fail(key: str, why: str) -> ConfigError:
        return ConfigError(f"{source}: {key}: {why}")

    unknown = sorted(set(raw) - TOP_LEVEL)
    if unknown:
        raise fail(unknown[0], f"unknown key (known: {', '.join(sorted(TOP_LEVEL))})")
    config = Config(source=source)
    if "redis" in raw:
        if not isinstance(raw["redis"], str) or not raw["redis"]:
            raise fail("redis", "must be a Redis URL string")
        config.redis = raw["redis"]
    if "prefix" in raw:
        if not isinstance(raw["prefix"], str) or not raw["prefix"]:
            raise fail("prefix", "must be a non-empty string")
        config.prefix = raw["prefix"]
    for key in defaults.SUPERVISOR:
        if key in raw:
            try:
                config.settings[key] = check_setting(key, raw[key])
            except InvalidInput as exc:
                raise fail(key, str(exc)) from None
    queues = raw.get("queues")
    if not isinstance(queues, dict) or not queues:
        raise fail("queues", "at least one [queues.NAME] table with a handler is needed")
    for name, table in queues.items():
        where = f"queues.{name}"
        try:
            queue_name(name)
        except InvalidInput as exc:
            raise fail(where, str(exc)) from None
        if not isinstance(table, dict):
            raise fail(where, "must be a table")
        options = dict(table)
        handler = options.pop("handler", None)
        if not isinstance(handler, str):
            raise fail(f"{where}.handler", "missing: the handler's module path")
        unknown = sorted(set(options) - set(defaults.LISTEN))
        if unknown:
            raise fail(f"{where}.{unknown[0]}", "unknown key")
        try:
            ListenOptions.build(name, handler, options, check=False)
        except InvalidInput as exc:
            raise fail(where, str(exc)) from None
        config.queues[name] = (handler, options)
    return config
