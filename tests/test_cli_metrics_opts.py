"""`queasy run` with a bad --metrics-port or --metrics-host (or config values): one clear
error naming the option and its value, exit code CONFIG, and nothing started: no embedded
server (its data directory is never made: no server.json, no AOF), no worker. Real
subprocesses of the command, on the project's embedded server (no `redis` configured)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import ACT, ROOT

from queasy_py import defaults
from queasy_py.cli import exitcodes


def queasy_run(tmp_path: Path, *args: str, config: str = "") -> subprocess.CompletedProcess:
    """`queasy run` of a config with no `redis` (the embedded server, data in tmp_path/data)."""
    toml = tmp_path / "queasy.toml"
    toml.write_text(f'workers = 1\n{config}[queues.q]\nhandler = "{ACT}"\n')
    env = {k: v for k, v in os.environ.items() if k != defaults.URL_ENV}
    env[defaults.DATA_DIR_ENV] = str(tmp_path / "data")
    return subprocess.run(
        [sys.executable, "-m", "queasy_py.cli", "run", str(toml), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_refused_before_start(
    done: subprocess.CompletedProcess, tmp_path: Path, *names: str
) -> None:
    out = done.stdout + done.stderr
    assert done.returncode == exitcodes.CONFIG, out
    # nothing was started: the embedded server never made its data directory
    data = tmp_path / "data"
    assert not (data / "server.json").exists()
    assert not data.exists() or not any(data.iterdir()), sorted(data.rglob("*"))
    assert "embedded" not in out.lower(), out
    errors = [line for line in out.splitlines() if " ERROR " in line]
    assert len(errors) == 1, out
    assert all(name in errors[0] for name in names), errors[0]
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--metrics-port", "70000"], ["--metrics-port", "70000"]),
        (["--metrics-port", "-1"], ["--metrics-port", "-1"]),
        (["--metrics-host", ""], ["--metrics-host", "''"]),
        (
            ["--metrics-port", "0", "--metrics-host", "no-such-host.invalid"],
            ["--metrics-host", "no-such-host.invalid"],
        ),
        (["--metrics-port", "0", "--metrics-host", "192.0.2.1"], ["--metrics-host", "192.0.2.1"]),
    ],
)
def test_a_bad_metrics_option_starts_nothing(
    tmp_path: Path, args: list[str], names: list[str]
) -> None:
    assert_refused_before_start(queasy_run(tmp_path, *args), tmp_path, *names)


def test_a_metrics_port_in_use_starts_nothing(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = queasy_run(tmp_path, "--metrics-port", str(port))
    assert_refused_before_start(
        done, tmp_path, "--metrics-port", f"metrics port {port} on 127.0.0.1 is in use"
    )


def test_a_bad_metrics_host_of_the_config_starts_nothing(tmp_path: Path) -> None:
    done = queasy_run(tmp_path, config='metrics_port = 0\nmetrics_host = "192.0.2.1"\n')
    assert_refused_before_start(done, tmp_path, "metrics_host", "192.0.2.1", "queasy.toml")
