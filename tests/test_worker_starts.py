"""Workers start at most `start_at_once` at a time (default: the core count), the next as one
is ready: a start is an interpreter importing, CPU-bound, and more at once than cores only
delays every one of them and so the first job (benchmarks/startup.py).

Real worker subprocesses of a supervisor built in this process; its loop is not run: the
test reads the workers' pipes itself through the supervisor's selector.
"""

from __future__ import annotations

import time

from runtime_helpers import close_unrun

from queasy_py import Client
from queasy_py.runtime.supervisor import Supervisor

HANDLER = "tests.runtime_handlers.quiet"


def test_workers_start_a_few_at_a_time_and_the_next_as_one_is_ready(
    redis_url: str, prefix: str
) -> None:
    client = Client(redis_url, prefix=prefix, workers=3)
    client.queue("starts").listen(HANDLER)
    sup = Supervisor(client)
    workers = sup.workers
    try:
        assert workers.start_at_once >= 1  # the core count by default
        workers.start_at_once = 1
        workers.ensure()
        assert len(workers.procs) == 1
        most_starting = len(workers.started)
        deadline = time.monotonic() + 60
        while not (len(workers.procs) == 3 and all(w.ready for w in workers.procs)):
            assert time.monotonic() < deadline, [w.ready for w in workers.procs]
            for key, _ in sup.events.select(1.0):
                kind, proc = key.data
                if kind == "conn":
                    workers.receive(proc)  # "ready" starts the next one
                most_starting = max(most_starting, len(workers.started))
        assert most_starting == 1
        assert len({w.pid for w in workers.procs}) == 3
    finally:
        close_unrun(sup, client)


def test_free_units_are_those_no_running_job_holds_not_the_loops_reservations() -> None:
    """The capacity gauges (metrics' queasy_capacity_units_free, the registry's free_units)
    count units held by running jobs; units reserved for a dequeue in flight are free to an
    operator (an idle supervisor polling showed 0 free units whenever a scrape met a dequeue
    in flight)."""
    from queasy_py.runtime.pool import Running, WorkerProc

    proc = WorkerProc(process=None, pipe=None, sentinel=-1)  # type: ignore[arg-type]
    proc.free -= 100  # a dequeue planned for this worker, in flight
    assert proc.idle_units == 100
    job = Running.__new__(Running)
    job.size = 30
    proc.jobs[1] = job
    assert proc.idle_units == 70
