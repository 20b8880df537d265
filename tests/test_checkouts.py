"""A dequeue reply's jobs onto workers (runtime/checkouts.py), against a supervisor built on
the test server but not run, with one worker that is this test's end of a socketpair (what a
worker is to the loop: a pipe and a pid).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from runtime_helpers import close_unrun

from queasy_py import Client
from queasy_py.runtime.frames import Pipe
from queasy_py.runtime.pool import WorkerProc
from queasy_py.runtime.supervisor import Supervisor

HANDLER = "tests.runtime_handlers.quiet"


@pytest.fixture
def built(redis_url: str, prefix: str) -> Iterator[tuple[Any, WorkerProc, socket.socket]]:
    client = Client(redis_url, prefix=prefix, workers=0)
    client.queue("a").listen(HANDLER, size=1)
    client.queue("b").listen(HANDLER, size=1)
    sup = Supervisor(client)
    ours, theirs = socket.socketpair()
    proc = WorkerProc(process=SimpleNamespace(pid=os.getpid()), pipe=Pipe(ours), sentinel=-1)
    proc.ready = True
    sup.workers.procs.append(proc)
    try:
        yield sup, proc, theirs
    finally:
        sup.workers.procs.clear()
        ours.close()
        theirs.close()
        close_unrun(sup, client)


def record(job_id: str, token: str) -> list[bytes]:
    """One job of a dequeue reply, as the library writes it (its reply 'rec': id, token, the
    record string)."""
    rec = b'1700000000000 1700000000000 0 0 0 0\t\t{"x": 1}'
    return [job_id.encode(), token.encode(), rec]


def test_a_reply_with_more_jobs_than_asked_takes_none_of_them(built: Any) -> None:
    """A reply is the library's only if it holds at most the jobs asked for. One with more
    raised IndexError after the first jobs were on their way to a worker, and the round then
    gave back the units of all of them (rounds.py: a malformed reply): those jobs ran on
    units counted free. Now it is refused before any job is taken."""
    sup, proc, _ = built
    state = sup.states["a"]
    proc.free -= 2  # the units of the two jobs asked for, as Rounds.send reserves them
    reply = [0, b""] + record("j1", "t.1") + record("j2", "t.2") + record("j3", "t.3")
    batches: dict = {}
    with pytest.raises(ValueError, match="3 jobs for 2 asked"):
        sup.rounds.checkouts.take(state, [proc, proc], reply, time.time(), batches)
    assert batches == {} and proc.jobs == {}
    assert sup.rounds.checkouts.seq == 0


def test_a_second_lease_is_held_only_for_an_id_running_in_its_own_queue(built: Any) -> None:
    """The ids running are looked up per queue: the same id in another queue is another job
    (it starts), the same id in the same queue is a second lease (held)."""
    sup, proc, _ = built
    checkouts = sup.rounds.checkouts
    proc.free -= 1
    batches: dict = {}
    checkouts.take(sup.states["a"], [proc], [0, b""] + record("same", "t.1"), time.time(), batches)
    checkouts.send(batches)
    assert [j.id for j in proc.jobs.values()] == ["same"]
    proc.free -= 2
    batches = {}
    now = time.time()
    checkouts.take(sup.states["b"], [proc], [0, b""] + record("same", "t.2"), now, batches)
    checkouts.take(sup.states["a"], [proc], [0, b""] + record("same", "t.3"), now, batches)
    assert [(j.queue, j.token) for j in batches[proc]] == [("b", "t.2")]
    assert [(job.queue, job.token) for job, _ in checkouts.twins.held] == [("a", "t.3")]


def test_a_reply_s_records_are_parsed_and_a_malformed_one_is_dropped_alone(built: Any) -> None:
    """Library 5.1.0's reply 'rec' gives each job's record string; take() splits it: the
    numbers at their places (run_at, then retry, stall and timeout after enqueued_at), the
    trace when there is one (at most MAX_TRACE), and the data after the second tab as it is
    (tabs and all). A record that does not parse is dropped alone, its units released."""
    sup, proc, _ = built
    state = sup.states["a"]
    free = proc.free
    proc.free -= 4
    trace = b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01"
    reply = [0, b""] + [b"j1", b"t.1", b"1700000000005 - 3 2 1 9\t" + trace + b'\t"a\tb"']
    reply += [b"j2", b"t.2", b"1700000000000 1 0 0 0\t\t{}"]  # five numbers: malformed
    reply += [b"j3", b"t.3", b"x 1 0 0 0 0\t\t{}"]  # a run_at that is no integer
    reply += [b"j4", b"t.4", b"1700000000000 1 0 0 0 0\t" + b"a" * 300 + b"\t{}"]
    batches: dict = {}
    sup.rounds.checkouts.take(state, [proc] * 4, reply, time.time(), batches)
    jobs = {job.id: job for job in batches[proc]}
    assert set(jobs) == {"j1", "j4"}, jobs
    j1 = jobs["j1"]
    assert (j1.token, j1.data, j1.run_at) == ("t.1", b'"a\tb"', 1700000000005)
    assert (j1.retry_count, j1.stall_count, j1.timeout_count) == (3, 2, 1)
    assert j1.trace == trace.decode()
    assert jobs["j4"].trace == ""  # longer than MAX_TRACE: none
    assert proc.free == free - 2  # the two dropped gave their units back
