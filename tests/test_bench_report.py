"""benchmarks/run.py writes its peer table at the top of RESULTS.md and keeps every section
after it: the old code kept only what followed "## Scale (queasy_py only)", so a run erased the
hand-written sections between its notes and that heading. A partial run (--only, --metrics)
writes RESULTS.md only when told to (--out): its table would replace the full one."""

from __future__ import annotations

from pathlib import Path

from benchmarks import run

HAND = "## Idle pickup, a dedicated run\n\nmeasured by hand\n"
SCALE = "## Scale (queasy_py only)\n\nscale.py's table\n"


def report(table: str) -> str:
    return f"# Benchmark results\n\n{table}\n\n## Notes\n\n- a note\n{run.REPORT_END}\n"


def test_a_report_keeps_every_section_after_the_last_one(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    out.write_text(report("old table") + "\n" + HAND + "\n" + SCALE)
    run.write_report(str(out), report("new table"))
    text = out.read_text()
    assert text.startswith(report("new table"))
    assert "old table" not in text
    assert text.endswith(HAND + "\n" + SCALE)


def test_a_report_into_a_new_file_is_the_report(tmp_path: Path) -> None:
    out = tmp_path / "new.md"
    run.write_report(str(out), report("t"))
    assert out.read_text() == report("t")


def test_a_partial_run_writes_results_md_only_when_told() -> None:
    every = list(run.METRICS)
    assert run.report_path(None, "", every) == run.RESULTS
    assert run.report_path(None, "queasy,huey", every) is None
    assert run.report_path(None, "", ["process"]) is None
    assert run.report_path(None, "", every, 14) is None  # another worker count
    assert run.report_path("/tmp/x.md", "queasy", ["process"]) == "/tmp/x.md"
