"""The worker's threads (runtime/worker.py): a real worker process on one end of a socketpair,
this test the supervisor on the other. Quick jobs run in the thread that reads the pipe,
message after message, with no thread switch; a job that holds that thread hands the
reading and the rest of its batch to other threads, so slow jobs still run side by side and
the next message is read while they run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from worker_process import Worker, ran

HANDLER = "runtime_handlers.threads"


@pytest.fixture
def worker(request: pytest.FixtureRequest) -> Iterator[Worker]:
    w = Worker({"q": HANDLER}, request.param)
    try:
        yield w
    finally:
        w.close()


@pytest.mark.parametrize("worker", [30.0], indirect=True)
def test_quick_jobs_run_in_the_reading_thread_message_after_message(worker: Worker) -> None:
    """The reader runs a message's quick jobs itself, sends their results in one message and
    reads the next: every job of three messages ran in one thread. (Before, each message
    handed the reading to another pool thread and woke a sender thread for its results:
    8-10 thread switches per message.) The watch's tick is 30 s here, so that a loaded
    machine cannot make it hand over."""
    threads = set()
    for _ in range(3):
        seqs = worker.send({}, {}, {})
        (message,) = worker.result_messages(3)
        assert sorted(r[0] for r in message) == seqs
        threads |= {ran(r)["thread"] for r in message}
    assert len(threads) == 1


@pytest.mark.parametrize("worker", [0.002], indirect=True)
def test_slow_jobs_of_one_batch_run_side_by_side(worker: Worker) -> None:
    """A job that holds the reading thread past the watch's tick hands the rest of its batch
    to helpers: three 0.6 s jobs ran in three threads, all started before the first ended."""
    seqs = worker.send({"sleep": 0.6}, {"sleep": 0.6}, {"sleep": 0.6})
    results = [r for m in worker.result_messages(3) for r in m]
    assert sorted(r[0] for r in results) == seqs
    runs = [ran(r) for r in results]
    first_end = min(r["end"] for r in runs)
    assert all(r["start"] < first_end for r in runs), runs
    assert len({r["thread"] for r in runs}) == 3


@pytest.mark.parametrize("worker", [0.002], indirect=True)
def test_the_next_message_is_read_while_a_slow_job_runs(worker: Worker) -> None:
    """The reading moves to another thread when a job holds it: a quick job sent while a
    2 s job runs comes back first."""
    (slow,) = worker.send({"sleep": 2.0})
    (quick,) = worker.send({})
    first = worker.result_messages(1)[0]
    second = worker.result_messages(1)[0]
    assert [r[0] for r in first] == [quick]
    assert [r[0] for r in second] == [slow]
