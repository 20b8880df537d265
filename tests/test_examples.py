"""examples/*.py run as a user runs them: the venv's python, from a scratch directory, no
$QUEASY_REDIS_URL (the embedded server of that directory's state), each to its own end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

pytestmark = pytest.mark.timeout(400)


def run_example(tmp_path: Path, name: str, *args: str, timeout: float) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEASY_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")  # not the user's own default server
    env["PYSPARK_PYTHON"] = sys.executable
    try:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / name), *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[-2000:]
        pytest.fail(f"{name} did not end in {timeout:g}s: {out!r}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_the_quickstart_runs_every_job_to_its_end(tmp_path: Path) -> None:
    out = run_example(tmp_path, "quickstart.py", timeout=120)
    assert out.count("sent email to ") == 11 and "dead letter: bounce-1" in out


def test_the_spark_dispatch_example_ends_once_its_jobs_ran(tmp_path: Path) -> None:
    """It waited for sum(counts().values()) == 0, which the totals of finished jobs never
    are: it dispatched and ran every job, then printed 'left: ...' forever."""
    out = run_example(
        tmp_path, "spark_dispatch.py", "--rows", "300", "--workers", "1", "--master",
        "local[1]", timeout=300,
    )  # fmt: skip
    assert "dispatched 300 rows: 300 created" in out, out[-2000:]


def test_the_history_report_example_ends_and_writes_its_report(tmp_path: Path) -> None:
    """As the Spark dispatch example: its supervisor was stopped only once every count,
    the totals too, was 0, never."""
    out = run_example(
        tmp_path, "history_report.py", "--jobs", "40", "--spread", "1", "--workers", "1",
        timeout=300,
    )  # fmt: skip
    assert "report written to report.html" in out, out[-2000:]
    assert (tmp_path / "report.html").stat().st_size > 0
