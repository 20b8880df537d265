"""`queasy run` configuration: a TOML file, or the [tool.queasy] table of ./pyproject.toml.

A file of its own (queasy.toml):            In pyproject.toml, the same under tool.queasy:

redis = "redis://127.0.0.1:6379/0"          [tool.queasy]
workers = 2                                 workers = 2
heartbeat_interval = 5.0                    [tool.queasy.queues.emails]
[queues.emails]                             handler = "myapp.handlers.email"
handler = "myapp.handlers.email"            size = 10
size = 10                                   [tool.queasy.queues.emails.fail_options]
[queues.emails.fail_options]                max_retries = 50
max_retries = 50

`redis` is optional (default: $QUEASY_REDIS_URL, else embedded); the other top-level keys are
`prefix` and those of defaults.SUPERVISOR; a queue table holds `handler` plus any keyword of
Queue.listen(). Errors name the key as it is written in the file read (`tool.queasy.queues...`
for a pyproject.toml).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import defaults
from ..errors import ConfigError, InvalidInput
from ..options import ListenOptions, check_setting
from ..store.connection import check_url
from ..validate import key_prefix, queue_name

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
            raise ConfigError(
                "no config file given and no ./pyproject.toml: give a TOML file "
                "([queues.NAME] tables) or run where pyproject.toml has [tool.queasy.queues.NAME]"
            )
    else:
        file = Path(path)
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config {file} is not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"malformed TOML in {file}: {exc}") from None
    if file.name == "pyproject.toml":
        tool = raw.get("tool", {})
        if not isinstance(tool, dict):
            raise ConfigError(f"{file}: tool must be a table")
        raw = tool.get("queasy")
        if raw is None:
            raise ConfigError(
                f"{file} has no [tool.queasy] table: add [tool.queasy.queues.NAME] tables "
                "with a handler"
            )
        if not isinstance(raw, dict):
            raise ConfigError(f"{file}: tool.queasy must be a table")
        return parse(raw, str(file), "tool.queasy.")
    return parse(raw, str(file))


def parse(raw: dict[str, Any], source: str, table: str = "") -> Config:
    """Check the config `raw` read from `source`; `table` is where it sits in that file
    ('tool.queasy.' in a pyproject.toml), so each error names a key as the file writes it."""

    def fail(key: str, why: str) -> ConfigError:
        return ConfigError(f"{source}: {table}{key}: {why}")

    unknown = sorted(set(raw) - TOP_LEVEL)
    if unknown:
        raise fail(unknown[0], f"unknown key (known: {', '.join(sorted(TOP_LEVEL))})")
    config = Config(source=source)
    if "redis" in raw:
        if not isinstance(raw["redis"], str) or not raw["redis"]:
            raise fail("redis", "must be a Redis URL string")
        try:
            check_url(raw["redis"])
        except ConfigError as exc:
            raise fail("redis", str(exc)) from None
        config.redis = raw["redis"]
    if "prefix" in raw:
        try:
            config.prefix = key_prefix(raw["prefix"])
        except InvalidInput as exc:
            raise fail("prefix", str(exc)) from None
    for key in defaults.SUPERVISOR:
        if key in raw:
            try:
                config.settings[key] = check_setting(key, raw[key])
            except InvalidInput as exc:
                raise fail(key, str(exc)) from None
    queues = raw.get("queues")
    if not isinstance(queues, dict) or not queues:
        raise fail("queues", f"at least one [{table}queues.NAME] table with a handler is needed")
    for name, value in queues.items():
        where = f"queues.{name}"
        try:
            queue_name(name)
        except InvalidInput as exc:
            raise fail(where, str(exc)) from None
        if not isinstance(value, dict):
            raise fail(where, f"must be a table ([{table}{where}])")
        options = dict(value)
        handler = options.pop("handler", None)
        if handler is None:
            raise fail(f"{where}.handler", "missing: the handler's module path")
        if not isinstance(handler, str):
            raise fail(f"{where}.handler", f"must be a module path string, not {handler!r}")
        unknown = sorted(set(options) - set(defaults.LISTEN))
        if unknown:
            raise fail(f"{where}.{unknown[0]}", "unknown key")
        try:
            ListenOptions.build(name, handler, options, check=False)
        except InvalidInput as exc:
            raise fail(where, str(exc)) from None
        config.queues[name] = (handler, options)
    return config
