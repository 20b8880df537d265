"""The README quotes queasy_py/defaults.py and exitcodes.py; these tests catch drift."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis
from lua_calls import NOW, Lua

from queasy_py import defaults
from queasy_py.cli import exitcodes
from queasy_py.store.library import Ack, ensure_loaded

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
        "WORKER_PING_TIMEOUT",
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


def drawn_transitions() -> set[tuple[str, str]]:
    """The (from, to) edges of the README's stateDiagram of a job's states."""
    diagram = README.split("```mermaid\nstateDiagram-v2\n", 1)[1].split("```", 1)[0]
    return set(re.findall(r"^\s*(\S+) --> ([^:\s]+)", diagram, re.MULTILINE))


def test_the_job_state_diagram_draws_the_transitions_the_library_makes(
    r: redis.Redis, redis_url: str, prefix: str
) -> None:
    """The README's diagram of a job's states against the library's FCALLs: each transition
    made here is drawn. It drew a retry as active -> waiting (a retry waits out its backoff,
    min_backoff 2 s by default: delayed), a blocked job as always waiting when the active one
    ends (delayed when its run_at is later), a requeued failed job as always waiting (blocked
    behind an active job with its id)."""
    with redis.Redis.from_url(redis_url) as conn:
        ensure_loaded(conn)
    lua = Lua(r, prefix)
    made = set()
    active = lua.take("b")
    lua.add("b", run_at=NOW + 9_000)  # blocked behind the active b, for later
    assert lua.counts()["blocked"] == 1
    assert lua.finish("c1", active) == Ack.OK
    assert lua.get_job("b")["state"] == "delayed"
    made.add(("blocked", "delayed"))
    retried = lua.take("r")  # a retry at its backoff
    lua.retry("c1", retried, NOW + round(defaults.LISTEN["min_backoff"] * 1000))
    assert lua.get_job("r")["state"] == "delayed"
    made.add(("active", "delayed"))
    assert lua.fail("c1", lua.take("f")) == Ack.OK
    lua.take("f", client="c2")  # run again, its failed record still kept
    assert lua.requeue("f")[0] == 1
    assert lua.counts()["blocked"] == 1
    made.add(("failed", "blocked"))
    assert made - drawn_transitions() == set()
