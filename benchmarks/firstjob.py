"""One start of `queasy run` until its first job has run: the part benchmarks/startup.py and
benchmarks/startup_timeline.py share. It imports no queasy_py (each caller chooses which
checkout runs: the job is dispatched with the caller's `dispatch`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def run_first_job(
    url: str,
    prefix: str,
    workers: int,
    tmp: Path,
    out: Path,
    entry: list[str],
    env: dict[str, str],
    dispatch: Callable[[str, str, dict], None],
    linger: float = 0.0,
) -> tuple[float, float, int]:
    """Write a TOML config for `workers` workers and a queue `start` whose handler
    (`startup_handler`, on `tmp`) appends the time it ran to `out`; dispatch one job to it
    (`dispatch(url, prefix, data)`); start `python <entry> run <config>` in `tmp` with `env`;
    wait (60 s at most) until the job ran, `linger` seconds more, then stop it (SIGTERM,
    SIGKILL of its group after 30 s). Returns (the time it was started, the time the job
    ran, its pid)."""
    config = tmp / "queasy.toml"
    config.write_text(
        f'redis = "{url}"\nprefix = "{prefix}"\nworkers = {workers}\n'
        '[queues.start]\nhandler = "startup_handler"\n'
    )
    dispatch(url, prefix, {"path": str(out)})
    started = time.time()
    proc = subprocess.Popen(
        [sys.executable, *entry, "run", str(config), "--log-level", "WARNING"],
        cwd=tmp,
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not out.exists() or not out.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no job ran (exit code {proc.returncode})")
            time.sleep(0.002)
        done = float(out.read_text().split()[0])
        time.sleep(linger)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return started, done, proc.pid
