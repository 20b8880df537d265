"""Several busy queues cost the loop no more per job than one: while the dequeues of a busy
queue are on their way, the loop sleeps in select() until their replies come (it used to wait
for the queue's ready time, already past: a select(0) after another, a core burnt for every
round trip); and a round's jobs go to each worker in one frame, whatever queues they are of
(it was one frame per queue).

A real supervisor runs in this process (a thread: no signal handlers) against the test
server, with real worker subprocesses; its selector, the round pipe's send and the workers'
send are wrapped only to count calls.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from queasy_py import Client
from queasy_py.runtime.pool import WorkerProc
from queasy_py.runtime.supervisor import Supervisor
from queasy_py.store.pipe import RedisPipe

HANDLER = "tests.runtime_handlers.quiet"


@pytest.mark.parametrize(
    "queues, workers, jobs, data",
    [
        (4, 2, 2000, {}),  # no-op jobs over 4 busy queues: each queue a few jobs a round
        (1, 1, 600, {"sleep": 0.002}),  # one queue; results come back a few at a time
    ],
    ids=["4-queues", "trickling-results"],
)
def test_busy_queues_do_not_spin_the_loop_and_a_round_is_one_frame_per_worker(
    redis_url: str,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    queues: int,
    workers: int,
    jobs: int,
    data: dict[str, Any],
) -> None:
    sends = {"rounds": 0, "frames": 0}
    pipe_send, worker_send = RedisPipe.send, WorkerProc.send

    def count_round(self: RedisPipe, *args: Any) -> None:
        sends["rounds"] += 1
        pipe_send(self, *args)

    def count_frame(self: WorkerProc, jobs: list[Any]) -> None:
        sends["frames"] += 1
        worker_send(self, jobs)

    monkeypatch.setattr(RedisPipe, "send", count_round)
    monkeypatch.setattr(WorkerProc, "send", count_frame)
    client = Client(redis_url, prefix=prefix, workers=workers)
    try:
        names = [f"spin-{i}" for i in range(queues)]
        for name in names:
            client.queue(name).dispatch_many([{"data": data} for _ in range(jobs // queues)])
            client.queue(name).listen(HANDLER, size=10)
        client.ready()
        sup = Supervisor(client)
        selects = {"all": 0, "idle": 0}
        select = sup.events.select

        def counted(timeout: float) -> list[Any]:
            events = select(timeout)
            selects["all"] += 1
            if timeout == 0 and not events:
                selects["idle"] += 1
            return events

        sup.events.select = counted  # type: ignore[method-assign]
        thread = threading.Thread(target=sup.run, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                counts = [client.queue(name).counts() for name in names]
                if all(c["waiting"] == 0 and c["active"] == 0 for c in counts):
                    break
                time.sleep(0.05)
            else:
                raise AssertionError(f"jobs left after 120 s: {counts}")
        finally:
            sup.request_stop()
            thread.join(timeout=60)
        assert not thread.is_alive()
        assert sum(c["finished"] for c in counts) == jobs
        # a spin is one idle select(0) after another for every round trip of a queue held
        # back by its dequeues in flight: hundreds for 2,000 jobs over 4 queues (about 0.5
        # a job); a few may come from a ready time that passed between two steps
        assert selects["idle"] <= jobs // 100, selects
        # each round's jobs, from up to 4 queues, in one frame per worker; with a frame per
        # queue it was about 3.5 frames a round for 4 queues and 2 workers
        assert sends["frames"] <= workers * sends["rounds"], sends
    finally:
        client.close()
