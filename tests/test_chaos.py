"""The short form of the chaos test (tests/chaos/): about a minute of supervisors SIGKILLed,
workers SIGKILLed and process groups frozen while handlers misbehave, then a drain; every
invariant of tests/chaos/invariants.py must hold. The long form: python -m tests.chaos."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.run import run_chaos


@pytest.mark.timeout(300)
def test_chaos_short(redis_url: str, prefix: str, tmp_path: Path) -> None:
    summary = run_chaos(
        redis_url,
        prefix,
        seconds=45.0,
        processes=3,
        seed=4,
        workdir=tmp_path,
        rate=28.0,
        drain_timeout=20.0,
    )
    print(" ".join(f"{k}={v}" for k, v in summary.details.items()))
    print(summary.line)
    if summary.violations:
        for path in summary.logs:
            print(f"----- {path.name} -----")
            print(path.read_text(errors="replace")[-4000:])
    assert not summary.violations, "\n".join(summary.violations[:50])
    assert summary.jobs >= 2000, summary.line
    assert summary.kills >= 10, summary.line
