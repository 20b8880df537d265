"""queasy_py's bytecode, written before a timed start, as `pip install` writes it for an
installed package (and did for every peer, in benchmarks/.peers-venv).

A checkout run in place has no __pycache__ until an import writes one, and with
PYTHONDONTWRITEBYTECODE set (these machines set it) no import ever does: every process of
queasy_py (the supervisor and each worker) then compiled its source at every start, 0.07 s of
the supervisor's CPU before its first job and 0.02-0.05 s of a worker's (README, profile item
22). compileall writes the files whatever that variable says.
"""

from __future__ import annotations

import compileall
import importlib.util
import os


def compile_queasy() -> str:
    """Write the bytecode of the queasy_py this interpreter imports (PYTHONPATH and sys.path
    as they are now); returns its directory."""
    spec = importlib.util.find_spec("queasy_py")
    if spec is None or spec.origin is None:
        raise RuntimeError("queasy_py is not importable here")
    path = os.path.dirname(spec.origin)
    if not compileall.compile_dir(path, quiet=1):
        raise RuntimeError(f"compileall failed for {path}")
    return path
