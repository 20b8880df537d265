"""A real worker process (runtime/worker.py) on one end of a socketpair, the test the
supervisor on the other: started as pool.start_worker starts one (argv: its pipe's fd, its
handlers, the queues whose results it sends), with the watch's tick (HAND_OVER_S) given."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from queasy_py.runtime.frames import Pipe, pack_jobs

TESTS = Path(__file__).resolve().parent
WORKER = (
    "import sys; from queasy_py.runtime import worker; "
    "worker.HAND_OVER_S = float(sys.argv[4]); worker.run(sys.argv[1:4])"
)


class Worker:
    """A worker process and the supervisor's end of its pipe. `handlers`: {queue: module
    path} (modules under tests/); every queue's results are sent back."""

    def __init__(self, handlers: dict[str, str], hand_over: float = 0.002) -> None:
        ours, theirs = socket.socketpair()
        ours.settimeout(10.0)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent)])
        argv = [str(theirs.fileno()), orjson.dumps(handlers).decode()]
        argv.append(orjson.dumps(list(handlers)).decode())
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, *argv, str(hand_over)],
            pass_fds=[theirs.fileno()],
            env=env,
            start_new_session=True,
        )
        theirs.close()
        self.pipe = Pipe(ours)
        self.queue = next(iter(handlers))
        self.seq = 0
        self.messages = 0  # result messages received
        try:
            assert self.pipe.recv_frame() == b'"ready"'
        except BaseException:
            self.close()
            raise

    def send(self, *jobs: tuple[str, Any] | dict[str, Any], trace: str = "") -> list[int]:
        """Send one message of jobs: a dict is data for the first queue, else (queue, data);
        the first job carries `trace` (a traceparent) when given. Returns their seqs."""
        heads, raws, seqs = [], [], []
        for job in jobs:
            queue, data = (self.queue, job) if isinstance(job, dict) else job
            self.seq += 1
            raw = data if isinstance(data, bytes) else orjson.dumps(data)
            heads.append(
                [self.seq, queue, f"j{self.seq}", 1_700_000_000_000, 0, 0, 0, trace, len(raw)]
            )
            raws.append(raw)
            seqs.append(self.seq)
            trace = ""
        self.pipe.send_frame(pack_jobs(heads, raws))
        return seqs

    def result_messages(self, count: int, timeout: float = 10.0) -> list[list[list[Any]]]:
        """The result messages until `count` results came (`timeout` s at most for each)."""
        self.pipe.sock.settimeout(timeout)
        messages: list[list[list[Any]]] = []
        while sum(len(m) for m in messages) < count:
            messages.append(orjson.loads(self.pipe.recv_frame()))
            self.messages += 1
        return messages

    def results(self, count: int, timeout: float = 10.0) -> list[list[Any]]:
        """The results until `count` came, from as many messages as it takes."""
        return [r for m in self.result_messages(count, timeout) for r in m]

    def nothing_more(self, wait: float = 0.5) -> None:
        self.pipe.sock.settimeout(wait)
        with pytest.raises(TimeoutError):
            extra = self.pipe.recv_frame()
            pytest.fail(f"unexpected results {extra!r}")

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
