"""Example handler: a module path whose module defines handle(data, job)."""

from __future__ import annotations

from queasy_py import Job, PermanentError


def handle(data: dict, job: Job) -> None:
    """Send an 'email' (prints it); bounces fail for good and go to the fail handler."""
    if data["to"].startswith("bounce"):
        raise PermanentError(f"mailbox {data['to']} does not exist")
    print(
        f"sent email to {data['to']} (job {job.id[:8]}, attempt {job.retry_count + 1})", flush=True
    )
