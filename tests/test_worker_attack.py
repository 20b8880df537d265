"""Attacks on the worker's threads (runtime/worker.py): a real worker process on one end of
a socketpair, this test the supervisor on the other (as tests/test_worker_threads.py does),
with handlers that sleep, spin, raise, return odd values or coroutines
(tests/runtime_handlers/attack.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from queasy_py.runtime.frames import Pipe, pack_jobs

TESTS = Path(__file__).resolve().parent
HANDLERS = {"q": "runtime_handlers.attack", "a": "runtime_handlers.attack_async"}
WORKER = (
    "import sys; from queasy_py.runtime import worker; "
    "worker.HAND_OVER_S = float(sys.argv[4]); worker.run(sys.argv[1:4])"
)


class Worker:
    """A worker process and the supervisor's end of its pipe."""

    def __init__(self, hand_over: float = 0.002) -> None:
        ours, theirs = socket.socketpair()
        ours.settimeout(10.0)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent)])
        argv = [str(theirs.fileno()), orjson.dumps(HANDLERS).decode(), '["q", "a"]']
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

    def send(self, *jobs: tuple[str, Any] | dict[str, Any]) -> list[int]:
        """Send one message of jobs: a dict is data for queue q, else (queue, data)."""
        heads, raws, seqs = [], [], []
        for job in jobs:
            queue, data = ("q", job) if isinstance(job, dict) else job
            self.seq += 1
            raw = data if isinstance(data, bytes) else orjson.dumps(data)
            heads.append(
                [self.seq, queue, f"j{self.seq}", 1_700_000_000_000, 0, 0, 0, "", len(raw)]
            )
            raws.append(raw)
            seqs.append(self.seq)
        self.pipe.send_frame(pack_jobs(heads, raws))
        return seqs

    def results(self, count: int, timeout: float = 10.0) -> list[list[Any]]:
        """The results until `count` came, from as many messages as it takes."""
        self.pipe.sock.settimeout(timeout)
        got: list[list[Any]] = []
        while len(got) < count:
            got.extend(orjson.loads(self.pipe.recv_frame()))
        return got

    def nothing_more(self, wait: float = 0.5) -> None:
        self.pipe.sock.settimeout(wait)
        with pytest.raises(TimeoutError):
            extra = self.pipe.recv_frame()
            pytest.fail(f"unexpected results {extra!r}")

    def close(self) -> None:
        self.pipe.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def ran(result: list[Any]) -> dict[str, Any]:
    assert result[2] is None, result
    return orjson.loads(result[3])


@pytest.fixture
def worker() -> Iterator[Worker]:
    w = Worker()
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
