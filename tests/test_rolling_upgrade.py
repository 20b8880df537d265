"""A deploy from the released code (commit RELEASED, library 4.2.1) to this one (5.0: a major
version, so the old supervisors stop before the new ones start; the new library converts the
queue's 4.x records at its first call), and an old supervisor refused a newer major library.

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


OLD_INFO = """
import json, sys
from queasy_py import Client
url, prefix = sys.argv[1:3]
with Client(url, workers=0, prefix=prefix) as client:
    info = client.queue("q").schedule_info()
    print(json.dumps(info and {"state": info.state, "fire_at": info.fire_at, "spec": info.spec}))
"""


def old_schedule_info(old_root: Path, rt: Runtime) -> dict[str, Any] | None:
    """The queue's schedule as the released code reads it (a client of this tree would load
    library 5.0 over the released 4.2.1 that the old supervisor runs on)."""
    done = old_python(old_root, OLD_INFO, rt.url, rt.prefix)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def old_server(rt: Runtime, old_root: Path) -> None:
    """The server as the released deploy left it: its library (4.2.1) loaded. (A server of
    these tests holds the bundled 5.0 from earlier tests: an old supervisor refuses it.)"""
    rt.r.function_load((old_root / "lua/queasy.lua").read_text(), replace=True)


def test_a_late_occurrence_an_old_supervisor_created_runs_under_a_new_one_of_the_same_config(
    rt: Runtime, old_root: Path
) -> None:
    """An old supervisor stores the schedule as written (`0/20 * * * * *`); a new one of the
    same config computes the canonical text (`*/20 * * * * *`): it took the stored text for a
    changed schedule and moved the pending occurrence, late after the old one stopped, to the
    next fire time, so the missed run (catch_up="once") never ran. Across the major version
    (4.2.1 to 5.0) the occurrence is a 4.x record the new library converts first."""
    spec = queue_spec(SCHEDULED, schedule="0/20 * * * * *")
    old_server(rt, old_root)
    old = rt.start({"q": spec}, root=old_root)
    wait_for(
        lambda: (i := old_schedule_info(old_root, rt)) and i["state"] == "delayed",
        what="the occurrence",
    )
    assert old.stop() == 0
    pending = old_schedule_info(old_root, rt)
    assert pending is not None and pending["fire_at"] is not None
    assert pending["spec"] == "cron 0/20 * * * * * UTC"  # as the released code writes it
    wait_for(lambda: time.time() > pending["fire_at"] + 1.5, timeout=25, what="a late occurrence")
    new = rt.start({"q": spec})
    (late, *_) = rt.wait_records(1, "start", timeout=25)
    assert late["fire_at"] == pending["fire_at"], "the late occurrence was moved, not run"
    q = rt.queue("q")
    wait_for(lambda: (i := q.schedule_info()) and i.fire_at > pending["fire_at"], what="the next")
    info = q.schedule_info()
    assert info is not None and info.spec == "cron 0/20 * * * * * UTC"  # the stored text kept
    assert new.stop() == 0
    assert "is now" not in new.log()
    assert rt.r.fcall("queasy_library", 0) == f"queasy_py {bundled_version()}"


# ---------------------------------------------------------------- jobs, producers, operators

OLD_PRODUCER = """
import json, sys, time
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
    elif op == "later":  # waiting when the old supervisor stops: 4.x records left behind
        for n in range(10):
            q.dispatch({"tag": f"later-{n}"}, id=f"later-{n}", delay=float(sys.argv[4]))
        q.dispatch({"tag": "later-0b"}, id="later-0", delay=float(sys.argv[4]))  # its update
    elif op == "purge":
        print(json.dumps(q.purge(sys.argv[4])))
    elif op == "version":
        print(client.redis.fcall("queasy_library", 0).decode())
"""


def test_a_deploy_from_4x_to_5_runs_every_job_once(rt: Runtime, old_root: Path) -> None:
    """A deploy across the major version (library 4.2.1 to 5.0: the two cannot share a server,
    test_an_old_supervisor_refuses_a_newer_major_library): the old supervisor runs the old
    producers' jobs and stops; jobs it left waiting (4.x records: delayed, one updated twice)
    and its failed job are converted at the new library's first call; the new supervisor runs
    each waiting one once, the new CLI requeues the old failure, and the new tools read it all."""
    old_server(rt, old_root)
    old = rt.start({"q": queue_spec()}, workers=2, root=old_root)
    wait_for(lambda: "listening on q" in old.log(), what="the old supervisor")
    done = old_python(old_root, OLD_PRODUCER, rt.url, rt.prefix, "dispatch")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) == 18
    later = old_python(old_root, OLD_PRODUCER, rt.url, rt.prefix, "later", "6")
    assert later.returncode == 0, later.stderr
    rt.wait_records(19, "end", timeout=30)
    wait_for(lambda: len(rt.records("start")) == 20, what="old-f's one run")
    assert old.stop() == 0
    assert not {s["id"] for s in rt.records("start")} & {f"later-{n}" for n in range(10)}
    new = rt.start({"q": queue_spec()}, workers=2)
    ends = rt.wait_records(29, "end", timeout=40)
    assert sorted(Counter(e["id"] for e in ends).values()) == [1] * 29
    assert sorted(Counter(s["id"] for s in rt.records("start")).values()) == [1] * 30
    assert {e["pid"] for e in ends if e["id"].startswith("later-")} <= new.workers()
    assert rt.r.fcall("queasy_library", 0) == f"queasy_py {bundled_version()}"
    q = rt.queue("q")
    assert q.counts().get("failed") == 1 and q.counts().get("waiting", 0) == 0
    job = q.get_job("old-f")
    assert job is not None and job.state == "failed"
    assert [r["tag"] for r in rt.records("start") if r["id"] == "later-0"] == ["later-0b"]
    # the old failure requeued by the new CLI: it runs once more (and fails again)
    cli = [sys.executable, "-m", "queasy_py.cli", "--log-level", "WARNING"]  # (run from ROOT)
    where = ["--redis", rt.url, "--prefix", rt.prefix]
    requeued = subprocess.run(
        [*cli, "requeue", "q", "--failed", "--id", "old-f", *where],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert requeued.returncode == 0, requeued.stderr
    wait_for(lambda: len(rt.records("start")) == 31, timeout=30, what="the requeued run")
    wait_for(lambda: q.counts().get("failed") == 2, what="its end (totals)")
    assert q.purge("finished") == 29 and q.purge("finished") == 0
    for tool in (["status"], ["jobs", "q", "--state", "all"], ["events", "q"]):
        shown = subprocess.run(
            [*cli, *tool, *where], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert shown.returncode == 0, (tool, shown.stderr)
    assert new.stop() == 0
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
