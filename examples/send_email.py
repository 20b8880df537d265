"""Example handler: a module path whose module defines handle(data, job)."""

from __future__ import annotations

import sys

from queasy_py import Job, PermanentError


def handle(data: dict, job: Job) -> None:
    """Send an 'email' (prints it); bounces fail for good and go to the fail handler."""
    if data["to"].startswith("bounce"):
        raise PermanentError(f"mailbox {data['to']} does not exist")
    # one write per line: two worker processes share this stdout
    sys.stdout.write(
        f"sent email to {data['to']} (job {job.id[:8]}, attempt {job.retry_count + 1})\n"
    )
    sys.stdout.flush()
