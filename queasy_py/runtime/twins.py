"""A second lease of a job this supervisor is already running: held, never started, until the
first run ends, then handed back to waiting (not counted), so the job runs again after it.

The server leases an id once while it is active, so a second lease for an id a worker still
runs means the server lost the first: a primary killed before its replica received the
dequeue (asynchronous replication; README "Redis Cluster", failover), the job waiting again
on the promoted replica. Starting it would run the id twice at once in this supervisor.
Holding the lease keeps the job active under it, so no other supervisor takes it meanwhile;
the first run's ack is then stale (its lease is gone) and the job runs once more, after it:
at least once, never twice at once here. Another supervisor that dequeued the job before
this one did is not covered (README).
"""

from __future__ import annotations

import logging

from . import outcomes
from .pool import Running, WorkerProc

log = logging.getLogger("queasy_py")


class Twins:
    """The held second leases of this client (`held`), released by `release_ended`."""

    def __init__(self, procs: list[WorkerProc], acks: list[outcomes.Ack]) -> None:
        self.procs = procs  # the live workers (Workers.procs: the list itself)
        self.acks = acks
        self.held: list[tuple[Running, str]] = []  # (job, its queue's base key)

    def running_ids(self) -> set[tuple[str, str]]:
        """(queue, id) of every job on a worker."""
        return {(job.queue, job.id) for proc in self.procs for job in proc.jobs.values()}

    def runs(self, queue: str, job_id: str) -> bool:
        """Whether a worker runs job `job_id` of `queue` (no set built: for one job)."""
        return any(
            job.id == job_id and job.queue == queue
            for proc in self.procs
            for job in proc.jobs.values()
        )

    def hold(self, job: Running, base: str) -> None:
        log.warning(
            "job %s of %s leased again while it runs here (the server lost its first lease: "
            "a failover?); held until that run ends, then handed back",
            job.id,
            job.queue,
        )
        self.held.append((job, base))

    def tokens(self) -> set[str]:
        return {job.token for job, _ in self.held}

    def release_ended(self) -> None:
        """Hand back the held leases whose first run has ended (the ack goes after its
        first run's, in the same round)."""
        running = self.running_ids()
        keep = []
        for job, base in self.held:
            if (job.queue, job.id) in running:
                keep.append((job, base))
            else:
                self._release(job, base, "its first run here ended")
        self.held = keep

    def release_all(self, why: str) -> None:
        for job, base in self.held:
            self._release(job, base, why)
        self.held = []

    def _release(self, job: Running, base: str, why: str) -> None:
        log.warning("job %s of %s handed back to waiting, not counted: %s", job.id, job.queue, why)
        self.acks.append(outcomes.retry(job, base, outcomes.NOW, "release", "", ""))
