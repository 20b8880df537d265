"""The worker's threads (runtime/worker.py): a real worker process on one end of a socketpair,
this test the supervisor on the other. Quick jobs run in the thread that reads the pipe,
message after message, with no thread switch; a job that holds that thread hands the
reading and the rest of its batch to other threads, so slow jobs still run side by side and
the next message is read while they run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from queasy_py.runtime.frames import Pipe, pack_jobs

TESTS = Path(__file__).resolve().parent
HANDLER = "runtime_handlers.threads"
#: a worker as pool.start_worker starts one (argv: its pipe's fd, its handlers, the queues
#: whose results it sends), with the watch's tick of the last argument
WORKER = (
    "import sys; from queasy_py.runtime import worker; "
    "worker.HAND_OVER_S = float(sys.argv[4]); worker.run(sys.argv[1:4])"
)


class Worker:
    """A worker process and the supervisor's end of its pipe."""

    def __init__(self, hand_over: float) -> None:
        ours, theirs = socket.socketpair()
        ours.settimeout(10.0)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent)])
        argv = [str(theirs.fileno()), orjson.dumps({"q": HANDLER}).decode(), '["q"]']
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, *argv, str(hand_over)],
            pass_fds=[theirs.fileno()],
            env=env,
            start_new_session=True,
        )
        theirs.close()
        self.pipe = Pipe(ours)
        self.seq = 0
        try:
            assert self.pipe.recv_frame() == b'"ready"'
        except BaseException:
            self.close()
            raise

    def send(self, *datas: dict[str, Any]) -> list[int]:
        heads, raws, seqs = [], [], []
        for data in datas:
            self.seq += 1
            raw = orjson.dumps(data)
            heads.append([self.seq, "q", f"j{self.seq}", 1_700_000_000_000, 0, 0, 0, "", len(raw)])
            raws.append(raw)
            seqs.append(self.seq)
        self.pipe.send_frame(pack_jobs(heads, raws))
        return seqs

    def results(self, count: int) -> list[list[list[Any]]]:
        """The result messages until `count` results came (10 s at most for each)."""
        messages: list[list[list[Any]]] = []
        while sum(len(m) for m in messages) < count:
            messages.append(orjson.loads(self.pipe.recv_frame()))
        return messages

    def close(self) -> None:
        self.pipe.close()  # the worker exits when its pipe closes
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def ran(result: list[Any]) -> dict[str, Any]:
    """What the handler returned: [seq, started, None, value_json]."""
    assert result[2] is None, result
    return orjson.loads(result[3])


@pytest.fixture
def worker(request: pytest.FixtureRequest) -> Iterator[Worker]:
    w = Worker(request.param)
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
        (message,) = worker.results(3)
        assert sorted(r[0] for r in message) == seqs
        threads |= {ran(r)["thread"] for r in message}
    assert len(threads) == 1


@pytest.mark.parametrize("worker", [0.002], indirect=True)
def test_slow_jobs_of_one_batch_run_side_by_side(worker: Worker) -> None:
    """A job that holds the reading thread past the watch's tick hands the rest of its batch
    to helpers: three 0.6 s jobs ran in three threads, all started before the first ended."""
    seqs = worker.send({"sleep": 0.6}, {"sleep": 0.6}, {"sleep": 0.6})
    results = [r for m in worker.results(3) for r in m]
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
    first = worker.results(1)[0]
    second = worker.results(1)[0]
    assert [r[0] for r in first] == [quick]
    assert [r[0] for r in second] == [slow]
