"""A rolling deploy from the released code (commit RELEASED, library 4.2.1) to this one (4.3.0):
supervisors and producers of both versions on one server and the same queues.

The released tree is built from the repository's own history (`git archive`) into a temporary
folder; an old supervisor runs it (its queasy_py, its lua/queasy.lua, its tests/ handlers) as
a real subprocess (runtime_helpers.Runtime.start(root=...)); an old producer or CLI runs it
through `python -c` / `-m queasy_py`. The tests skip only where git is not installed.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from runtime_helpers import ROOT, Runtime, queue_spec, wait_for

#: the released tree: library 4.2.1
RELEASED = "0644220"
SCHEDULED = "tests.runtime_handlers.scheduled"


@pytest.fixture(scope="module")
def old_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The released tree, archived from this repository's history."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the released tree cannot be built")
    tar = subprocess.run(
        ["git", "-C", str(ROOT), "archive", RELEASED], check=True, capture_output=True
    ).stdout
    root = tmp_path_factory.mktemp("released")
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(root, filter="data")
    assert "VERSION = '4.2.1'" in (root / "lua/queasy.lua").read_text()
    return root


@pytest.fixture
def rt(redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(redis_url, prefix, r, tmp_path) as runtime:
        yield runtime


def old_python(old_root: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`code` run by the released queasy_py (its checkout first on sys.path)."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=old_root,
        env={"PYTHONPATH": str(old_root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def starts(rt: Runtime) -> list[dict[str, Any]]:
    return rt.records("start")


# ---------------------------------------------------------------- schedules


def test_a_late_occurrence_an_old_supervisor_created_runs_under_a_new_one_of_the_same_config(
    rt: Runtime, old_root: Path
) -> None:
    """An old supervisor stores the schedule as written (`0/20 * * * * *`); a new one of the
    same config computes the canonical text (`*/20 * * * * *`): it took the stored text for a
    changed schedule and moved the pending occurrence, late after the old one stopped, to the
    next fire time, so the missed run (catch_up="once") never ran. Each version's create
    wrote its own text, so in a mixed deploy the two moved late occurrences back and forth."""
    spec = queue_spec(SCHEDULED, schedule="0/20 * * * * *")
    old = rt.start({"q": spec}, root=old_root)
    q = rt.queue("q")
    wait_for(lambda: (i := q.schedule_info()) and i.state == "delayed", what="the occurrence")
    assert old.stop() == 0
    pending = q.schedule_info()
    assert pending is not None and pending.fire_at is not None
    assert pending.spec == "cron 0/20 * * * * * UTC"  # as the released code writes it
    wait_for(lambda: time.time() > pending.fire_at + 1.5, timeout=25, what="a late occurrence")
    new = rt.start({"q": spec})
    (late, *_) = rt.wait_records(1, "start", timeout=25)
    assert late["fire_at"] == pending.fire_at, "the late occurrence was moved, not run"
    # the text stays the one the old supervisors compare with: they do not move it back
    wait_for(lambda: (i := q.schedule_info()) and i.fire_at > pending.fire_at, what="the next")
    info = q.schedule_info()
    assert info is not None and info.spec == "cron 0/20 * * * * * UTC"
    assert new.stop() == 0
    assert "is now" not in new.log()
