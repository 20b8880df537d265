"""A rolling deploy from the released code (commit RELEASED, library 4.2.1) to this one (4.3+):
supervisors and producers of both versions on one server and the same queues.

The released tree is built from the repository's own history (`git archive`) into a temporary
folder; an old supervisor runs it (its queasy_py, its lua/queasy.lua, its tests/ handlers) as
a real subprocess (runtime_helpers.Runtime.start(root=...)); an old producer or CLI runs it
through `python -c` / `-m queasy_py`. The tests skip only where git is not installed or
the clone lacks that commit (a shallow clone).
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from runtime_helpers import ROOT, Runtime, queue_spec, wait_for

from queasy_py.store.library import bundled_version

#: the released tree: library 4.2.1
RELEASED = "0644220"
SCHEDULED = "tests.runtime_handlers.scheduled"


@pytest.fixture(scope="module")
def old_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The released tree, archived from this repository's history."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the released tree cannot be built")
    known = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{RELEASED}^{{commit}}"], capture_output=True
    )
    if known.returncode != 0:  # a shallow clone, or a tree without its history
        pytest.skip(f"commit {RELEASED} is not in this clone's history: no released tree")
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


# ---------------------------------------------------------------- jobs, producers, operators

OLD_PRODUCER = """
import json, sys
from queasy_py import Client
url, prefix, op = sys.argv[1:4]
with Client(url, workers=0, prefix=prefix) as client:
    q = client.queue("q")
    if op == "dispatch":
        q.dispatch({"tag": "old-1", "sleep": 0.05}, id="old-1")
        q.dispatch({"tag": "old-f", "raise": "permanent", "times": 1}, id="old-f")
        jobs = [{"data": {"tag": f"old-{n}", "sleep": 0.05}, "id": f"old-{n}"}
                for n in range(2, 20)]
        ids = q.dispatch_many(jobs)
        print(json.dumps(ids))
    elif op == "purge":
        print(json.dumps(q.purge(sys.argv[4])))
    elif op == "version":
        print(client.redis.fcall("queasy_library", 0).decode())
"""


def test_old_and_new_supervisors_and_producers_share_a_queue(rt: Runtime, old_root: Path) -> None:
    """Old and new supervisors on one queue, fed by producers of both versions: every job runs
    once, none is left leased, the newest library stays loaded (an old client never loads 4.2.1
    back), and each side's purge gets the reply it knows."""
    new = rt.start({"q": queue_spec()}, workers=2)
    q = rt.queue("q")
    wait_for(lambda: "listening on q" in new.log(), what="the new supervisor")  # 4.3.0 loaded
    old = rt.start({"q": queue_spec()}, workers=2, root=old_root)
    wait_for(lambda: "listening on q" in old.log(), what="the old supervisor")
    q.dispatch_many(
        [{"data": {"tag": f"new-{n}", "sleep": 0.05}, "id": f"new-{n}"} for n in range(19)]
    )
    q.dispatch({"tag": "new-f", "raise": "permanent", "times": 1}, id="new-f")
    done = old_python(old_root, OLD_PRODUCER, rt.url, rt.prefix, "dispatch")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) == 18
    ends = rt.wait_records(38, "end", timeout=30)
    assert sorted(Counter(e["id"] for e in ends).values()) == [1] * 38
    wait_for(lambda: q.counts().get("failed") == 2, what="the two failed jobs")
    assert sorted(Counter(s["id"] for s in rt.records("start")).values()) == [1] * 40
    pids = {e["pid"] for e in ends}
    assert pids & old.workers() and pids & new.workers(), "both versions ran jobs"
    version = old_python(old_root, OLD_PRODUCER, rt.url, rt.prefix, "version")
    assert version.stdout.strip() == f"queasy_py {bundled_version()}", version.stderr
    assert rt.r.fcall("queasy_library", 0) == f"queasy_py {bundled_version()}"
    wait_for(lambda: q.counts().get("active", 0) == 0, what="no lease left")
    # purges of either version against 4.3.0
    purged = old_python(old_root, OLD_PRODUCER, rt.url, rt.prefix, "purge", "finished")
    assert purged.returncode == 0, purged.stderr
    assert json.loads(purged.stdout) + q.purge("finished") == 38
    assert q.purge("finished") == 0
    # failed jobs requeued by either version's CLI: each runs once more (and finishes)
    cli = [sys.executable, "-m", "queasy_py.cli", "--log-level", "WARNING", "requeue"]
    where = ["--redis", rt.url, "--prefix", rt.prefix, "q", "--failed"]
    env = {"PYTHONPATH": str(old_root), "PATH": "/usr/bin:/bin"}
    first = subprocess.run(
        [*cli, *where, "--id", "new-f"],
        cwd=old_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert first.returncode == 0, first.stderr
    second = subprocess.run(
        [str(Path(sys.executable).with_name("queasy")), "requeue", *where, "--id", "old-f"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 0, second.stderr
    # (each fails again: its attempt count starts over)
    wait_for(lambda: len(rt.records("start")) == 42, timeout=30, what="the requeued runs")
    wait_for(lambda: q.counts().get("failed") == 4, what="the requeued jobs' ends (totals)")
    counts = Counter(s["id"] for s in rt.records("start"))
    assert counts.pop("old-f") == counts.pop("new-f") == 2
    assert set(counts.values()) == {1}
    for tool in (
        [*cli[:-1], "status"],
        [*cli[:-1], "jobs", "q", "--state", "all"],
        [*cli[:-1], "events", "q"],
    ):
        for argv, cwd, extra in (
            (tool, old_root, env),
            ([str(Path(sys.executable).with_name("queasy")), *tool[3:]], ROOT, None),
        ):
            shown = subprocess.run(
                [*argv, "--redis", rt.url, "--prefix", rt.prefix],
                cwd=cwd,
                env=extra,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert shown.returncode == 0, (argv, shown.stderr)
    assert old.stop() == 0 and new.stop() == 0
    for sup in (old, new):
        errors = [line for line in sup.log().splitlines() if " ERROR " in line]
        assert all("failed for good" in line for line in errors), errors


def test_an_old_supervisor_refuses_a_newer_major_library(rt: Runtime, old_root: Path) -> None:
    """Library 5.0.0 is a major version (a stored layout 4.x cannot read: README, "Library
    version"): a 4.x supervisor meeting it refuses to start, naming both versions, and
    leaves the library and the queue's jobs as they are; a 4.x producer refuses too."""
    if int(bundled_version().split(".")[0]) < 5:
        pytest.skip("the bundled library is of the released major")
    q = rt.queue("q")
    q.dispatch({"tag": "kept"}, id="kept")  # the new client loads the bundled library
    old = rt.start({"q": queue_spec()}, workers=1, root=old_root)
    assert old.wait(timeout=30) != 0
    assert "newer major" in old.log() and bundled_version() in old.log(), old.log()
    done = old_python(old_root, OLD_PRODUCER, rt.url, rt.prefix, "dispatch")
    assert done.returncode != 0 and "newer major" in done.stderr, done.stderr
    assert rt.r.fcall("queasy_library", 0) == f"queasy_py {bundled_version()}"
    job = q.get_job("kept")
    assert job is not None and job.state == "waiting" and q.counts()["waiting"] == 1
