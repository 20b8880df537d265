"""Attacks on the worker's threads (runtime/worker.py): a real worker process on one end of
a socketpair, this test the supervisor on the other (as tests/test_worker_threads.py does),
with handlers that sleep, spin, raise, return odd values or coroutines
(tests/runtime_handlers/attack.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from worker_process import Worker, ran

HANDLERS = {"q": "runtime_handlers.attack", "a": "runtime_handlers.attack_async"}


@pytest.fixture
def worker() -> Iterator[Worker]:
    w = Worker(HANDLERS)
    try:
        yield w
    finally:
        w.close()


def test_a_quick_result_does_not_wait_for_a_slow_job_after_it(worker: Worker) -> None:
    """[quick, 3 s]: the reader runs the quick job, then the slow one; the hand-over comes
    2-4 ms into the slow job. The quick job's result must go out then, not after 3 s (a
    job blocked until its timeout would have the supervisor record the quick one as timed
    out too, and run it again)."""
    quick, slow = worker.send({}, {"sleep": 3.0})
    t0 = time.monotonic()
    first = worker.results(1)
    assert [r[0] for r in first] == [quick]
    assert time.monotonic() - t0 < 1.0
    assert [r[0] for r in worker.results(1)] == [slow]


def test_a_cpu_bound_job_still_hands_the_reading_over(worker: Worker) -> None:
    """A handler spinning in pure Python holds the GIL: the watch runs at the switch
    interval (5 ms) and hands over; a quick job sent behind it comes back first."""
    (spin,) = worker.send({"spin": 1.5})
    time.sleep(0.05)
    t0 = time.monotonic()
    (quick,) = worker.send({})
    first = worker.results(1)
    assert [r[0] for r in first] == [quick]
    assert time.monotonic() - t0 < 1.0
    assert [r[0] for r in worker.results(1)] == [spin]


def test_a_hundred_short_io_jobs_of_one_message_run_side_by_side(worker: Worker) -> None:
    """100 jobs of 1-3 ms sleep in one message: after the hand-over they run side by side,
    far from the 200 ms they take one after the other."""
    for _ in range(3):  # the pool's threads exist after the first round
        seqs = worker.send(*({"sleep": 0.001 + 0.002 * (i % 2)} for i in range(100)))
        t0 = time.monotonic()
        got = worker.results(100)
        took = time.monotonic() - t0
        assert sorted(r[0] for r in got) == seqs
    assert took < 0.15, took
    runs = [ran(r) for r in got]
    assert len({r["thread"] for r in runs}) > 10


def test_a_thousand_quick_jobs_in_one_message(worker: Worker) -> None:
    """Each result once, and in a few messages even when the batch is handed over (about
    10 a batch; a flush after each job in helpers made it 400 and doubled the time)."""
    for _ in range(10):
        before = worker.messages
        seqs = worker.send(*({} for _ in range(1000)))
        got = worker.results(1000)
        assert sorted(r[0] for r in got) == seqs
        assert worker.messages - before < 100
    worker.nothing_more()


def test_a_mix_of_async_plain_and_coroutine_returning_jobs(worker: Worker) -> None:
    """Every kind of job in one message, quick and slow: each result comes exactly once."""
    jobs: list[Any] = []
    for i in range(60):
        kind = i % 4
        if kind == 0:
            jobs.append({})
        elif kind == 1:
            jobs.append({"sleep": 0.01 * (i % 3)})
        elif kind == 2:
            jobs.append(("a", {"sleep": 0.01 * (i % 3)}))
        else:
            jobs.append({"coro": 0.01 * (i % 3)})
    for _ in range(5):
        seqs = worker.send(*jobs)
        got = worker.results(len(seqs))
        assert sorted(r[0] for r in got) == seqs
        assert all(r[2] is None for r in got), got
    worker.nothing_more()


def test_base_exceptions_unencodable_values_and_bad_data_fail_their_job_alone(
    worker: Worker,
) -> None:
    seqs = worker.send(
        {"raise": "SystemExit"},
        {"raise": "KeyboardInterrupt"},
        {"unencodable": True},
        ("q", b"{not json"),
        {},
    )
    got = {r[0]: r for r in worker.results(5)}
    assert sorted(got) == seqs
    assert got[seqs[0]][2]["name"] == "SystemExit"
    assert got[seqs[1]][2]["name"] == "KeyboardInterrupt"
    assert got[seqs[2]][2]["name"] == "InvalidResult"
    assert got[seqs[3]][2]["name"] == "InvalidJobData"
    assert got[seqs[4]][2] is None
    (again,) = worker.send({})  # the worker goes on
    assert [r[0] for r in worker.results(1)] == [again]


@pytest.mark.parametrize("tick", [0.0001, 0.002])
def test_results_come_once_each_through_many_hand_overs(tick: float) -> None:
    """Messages of quick and 1-10 ms jobs sent without waiting, with the watch's tick and a
    0.1 ms one (a hand-over at nearly every message): hand-overs race the readers' returns
    to recv; every result comes exactly once."""
    worker = Worker(HANDLERS, tick)
    try:
        _once_each(worker)
    finally:
        worker.close()


def _once_each(worker: Worker) -> None:
    sent: list[int] = []
    for i in range(200):
        sent += worker.send(
            *({"sleep": 0.001 * ((i + j) % 10)} if (i + j) % 3 else {} for j in range(1 + i % 4))
        )
        if i % 20 == 19:
            time.sleep(0.005)
    got = worker.results(len(sent), timeout=20)
    assert sorted(r[0] for r in got) == sent
    worker.nothing_more()


def _exits_at_once(w: Worker) -> None:
    """The pipe closed, the worker process ends within 2 s, jobs and all."""
    t0 = time.monotonic()
    w.pipe.close()
    w.proc.wait(timeout=5)
    assert time.monotonic() - t0 < 2.0


def test_the_worker_exits_at_once_when_its_pipe_closes_under_blocked_jobs() -> None:
    w = Worker(HANDLERS)
    try:
        w.send({"sleep": 60}, {"sleep": 60}, ("a", {"sleep": 60}))
        w.send({"spin": 60})
        time.sleep(0.3)  # the jobs start (were they not, the exit would be as quick)
        _exits_at_once(w)
    finally:
        w.close()


def test_slow_jobs_behind_a_slow_to_decode_one_still_run_side_by_side(worker: Worker) -> None:
    """A job whose data takes the reader longer than the watch's tick to decode (1 MB of
    small objects: 10-30 ms) comes first: the hand-over happens while the reader decodes,
    with the backlog still empty. The three 0.6 s jobs after it must still run side by
    side, not one after the other in the old reader (1.8 s)."""
    big = {"pad": [{"k": i} for i in range(90_000)]}
    seqs = worker.send(big, {"sleep": 0.6}, {"sleep": 0.6}, {"sleep": 0.6})
    got = worker.results(4)
    assert sorted(r[0] for r in got) == seqs
    runs = [ran(r) for r in got if r[0] != seqs[0]]
    first_end = min(r["end"] for r in runs)
    assert all(r["start"] < first_end for r in runs), runs


def test_slow_jobs_handed_over_before_they_are_in_the_backlog_run_side_by_side() -> None:
    """97 async jobs, then three 0.3 s plain ones, in one message: starting the async jobs
    keeps the reader in the message, and a reader preempted there for a tick (a loaded
    machine; here a 0.2 ms tick) is handed over before the plain jobs are in the backlog,
    with none for helpers. They must still run side by side, not one after the other in
    the old reader (before the fix: 10 rounds of 10 one after the other)."""
    worker = Worker(HANDLERS, 0.0002)
    try:
        _side_by_side_behind_async(worker)
    finally:
        worker.close()


def _side_by_side_behind_async(worker: Worker) -> None:
    for _ in range(5):
        seqs = worker.send(*(("a", {}) for _ in range(97)), *({"sleep": 0.3} for _ in range(3)))
        got = worker.results(100)
        assert sorted(r[0] for r in got) == seqs
        runs = [ran(r) for r in got if r[0] in seqs[-3:]]
        first_end = min(r["end"] for r in runs)
        assert all(r["start"] < first_end for r in runs), runs


def test_slow_jobs_behind_the_first_traced_one_still_run_side_by_side(worker: Worker) -> None:
    """The first traced job imports opentelemetry while the reader is in the message (tens
    of ms, the backlog still empty): the watch hands over then, with nothing to hand to
    helpers. The three 0.6 s jobs after it must still run side by side, not one after the
    other in the old reader (1.8 s)."""
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    seqs = worker.send({}, {"sleep": 0.6}, {"sleep": 0.6}, {"sleep": 0.6}, trace=trace)
    got = worker.results(4)
    assert sorted(r[0] for r in got) == seqs
    runs = [ran(r) for r in got if r[0] != seqs[0]]
    first_end = min(r["end"] for r in runs)
    assert all(r["start"] < first_end for r in runs), runs


def test_a_result_whose_check_itself_fails_fails_its_job(worker: Worker) -> None:
    """A returned dict with a non-str key whose repr raises: the check of the value must
    fail the job (InvalidResult), not lose its result (the job would time out and run
    again, each time)."""
    seqs = worker.send({"bad_key": True}, {"bad_str": True}, {})
    got = {r[0]: r for r in worker.results(3, timeout=3)}
    assert sorted(got) == seqs
    assert got[seqs[0]][2]["name"] == "InvalidResult"
    assert got[seqs[2]][2] is None


@pytest.mark.parametrize("per_message", [100, 1, 3])
def test_a_worker_full_of_blocked_jobs_still_reads_its_pipe(per_message: int) -> None:
    """All 100 units taken by blocked jobs (one message of 100, 100 of 1, or of 3 and 1):
    a thread still reads, so the worker sees its pipe close and exits at once."""
    w = Worker(HANDLERS)
    try:
        left = 100
        while left:
            n = min(per_message, left)
            w.send(*({"sleep": 60} for _ in range(n)))
            left -= n
            time.sleep(0.01)
        time.sleep(0.5)
        _exits_at_once(w)
    finally:
        w.close()
