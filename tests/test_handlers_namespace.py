"""The ready-made handlers live under the package (issue 10): the wheel installs no top-level
`handlers` package (a user's own `handlers/` would hide it, or be hidden by it). The repo keeps
them in its top-level handlers/ folder, installed as queasy_py.handlers; .ci/wheel-check checks
the installed wheel itself."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import queasy_py

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(queasy_py.__file__).resolve().parent


def test_the_wheel_installs_only_the_queasy_py_package() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert all(p == "queasy_py" or p.startswith("queasy_py.") for p in setuptools["packages"])
    assert "queasy_py.handlers" in setuptools["packages"]
    assert setuptools["package-dir"]["queasy_py.handlers"] == "handlers"


def test_queasy_py_handlers_import_where_no_top_level_handlers_is(tmp_path: Path) -> None:
    """An interpreter that sees queasy_py and the installed dependencies only, as a wheel
    install does (no repository root, no editable finder): queasy_py.handlers imports, the old
    name does not, and a handler named by it gets a HandlerError saying where it went."""
    (tmp_path / "queasy_py").symlink_to(PACKAGE)
    code = """
import importlib.util, sys
from queasy_py.errors import HandlerError
from queasy_py.runtime.handler import load
assert importlib.util.find_spec("handlers") is None
import queasy_py.handlers.dead_letter, queasy_py.handlers.reschedule
for name in ("dead_letter", "reschedule"):
    handle, is_async = load("queasy_py.handlers." + name)
    assert callable(handle) and not is_async
    try:
        load("handlers." + name)
    except HandlerError as exc:
        print(exc)
    else:
        raise AssertionError("the old name imported")
"""
    site = sysconfig.get_paths()["purelib"]
    done = subprocess.run(
        [sys.executable, "-S", "-c", code],  # -S: no site, so no .pth (editable) finders
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{site}"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    for line, name in zip(lines, ("dead_letter", "reschedule"), strict=True):
        assert f"handler module 'handlers.{name}' failed to import" in line
        assert f"the ready-made handlers moved: name it 'queasy_py.handlers.{name}'" in line
