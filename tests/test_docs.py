"""The README quotes queasy_py/defaults.py and exitcodes.py; these tests catch drift."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from queasy_py import defaults
from queasy_py.cli import exitcodes

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
ROW = re.compile(r"^\| `([a-z_]+)` \| `([^`]*)` \|", re.MULTILINE)


def table_after(marker: str) -> dict[str, str]:
    """The `name` | `value` rows of the first table after `marker` in the README."""
    start = README.index(marker)
    block = README[start:].split("\n\n", 2)
    table = block[1] if block[1].lstrip().startswith("|") else block[2]
    return dict(ROW.findall(table.split("\n\n")[0]))


@pytest.mark.parametrize(
    ("marker", "source"),
    [
        ("(`defaults.LISTEN`)", defaults.LISTEN),
        ("(`defaults.FAIL_OPTIONS`)", defaults.FAIL_OPTIONS),
        ("(`defaults.SUPERVISOR`)", defaults.SUPERVISOR),
    ],
)
def test_readme_tables_quote_the_defaults(marker: str, source: dict) -> None:
    documented = table_after(marker)
    assert set(documented) == set(source), marker
    for key, value in source.items():
        assert documented[key] == repr(value).replace("_", ""), key


@pytest.mark.parametrize(
    "name",
    [
        "PREFIX",
        "FAIL_QUEUE_SUFFIX",
        "MAX_PAYLOAD_BYTES",
        "CONNECT_ATTEMPTS",
        "CONNECT_BACKOFF",
        "RUN_CONNECT_TIMEOUT",
        "MAX_CONNECTIONS",
        "WORKER_UNITS",
        "LOOP_REDIS_TIMEOUT",
        "WORKER_START_TIMEOUT",
        "WORKER_START_FAILURES",
        "DATA_DIR_ENV",
        "STATE_DIR_NAME",
        "KEEPER_POLL_INTERVAL",
        "EMBEDDED_START_TIMEOUT",
        "KEEPER_RESTARTS",
        "KEEPER_RESTART_WINDOW",
        "DEDUP_WINDOW",
        "TRACEBACK_BYTES",
        "EVENT_TRACEBACK_BYTES",
        "DASHBOARD_HOST",
        "DASHBOARD_PORT",
        "DASHBOARD_TOKEN_ENV",
        "DASHBOARD_PAGE",
        "DASHBOARD_EVENTS",
        "DASHBOARD_REFRESH",
        "RESULT_RECHECK",
        "REGISTRY_RETRY",
    ],
)
def test_readme_quotes_the_constants(name: str) -> None:
    value = getattr(defaults, name)
    text = f'"{value}"' if isinstance(value, str) else str(value)
    assert f"`{name} = {text}`" in README


def test_readme_lists_every_exit_code() -> None:
    codes = {k: v for k, v in vars(exitcodes).items() if k.isupper()}
    for name, value in codes.items():
        assert f"| {value} | `{name}` |" in README, name


def test_the_library_keeps_the_event_traceback_length_of_the_defaults() -> None:
    """lua/queasy.lua cuts an event's traceback itself: its constant is the default's."""
    lua = (Path(__file__).resolve().parent.parent / "lua" / "queasy.lua").read_text()
    assert f"local EVENT_TRACEBACK = {defaults.EVENT_TRACEBACK_BYTES} " in lua
