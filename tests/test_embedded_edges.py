"""The project's embedded server at its edges: project paths a URL would misread, a process
killed while it starts the server. Real `queasy` subprocesses and servers; bounded waits.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from test_embedded_shared import PYPROJECT, Project, project

__all__ = ["project"]  # the fixture, imported

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("QUEASY_TEST_REDIS_URL")), reason="tests the embedded server itself"
)


def test_a_project_path_holding_url_characters_reaches_its_server(project: Project) -> None:
    """A project in `~/work/R&D #2 @home/50%41` (a `#`, `?`, `@` or `%` in its path): the
    server's URL put the socket path in unencoded, so `#` ended it as a fragment, `?` as a
    query, `%41` was read as `A` and an `@` as the end of the credentials: every command
    failed to connect (or refused the URL) on a server it had just started."""
    # short enough for its socket to sit in it (a longer path puts it under a hash in /tmp)
    weird = Path(tempfile.mkdtemp(prefix="R&D #2 ?x @home 50%41 ü-"))
    try:
        (weird / "pyproject.toml").write_text(PYPROJECT)
        done = project.queasy("dispatch", "q", '"odd"', "--id", "odd-1", cwd=weird)
        assert done.returncode == 0, done.stderr
        listed = project.queasy("jobs", "q", "--json", cwd=weird)
        assert listed.returncode == 0, listed.stderr
        assert '"id":"odd-1"' in listed.stdout
    finally:
        shutil.rmtree(weird)
