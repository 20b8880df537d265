"""rq: `rq worker` x2 (fork-per-job `Worker`, rq's default) or x2 `SimpleWorker` (--mode simple)."""

from __future__ import annotations

import os
import sys

import common


class RqAdapter(common.Adapter):
    lib = "rq"
    has_bulk = True

    def __init__(self, args):
        super().__init__(args)
        import rq
        from redis import Redis
        from tasks import rq_tasks

        self.version = rq.__version__ if hasattr(rq, "__version__") else rq.VERSION
        self.simple = args.mode == "simple"
        self.mode = (
            f"{args.workers} x `rq worker -w rq.SimpleWorker`"
            if self.simple
            else f"{args.workers} x `rq worker` (fork per job)"
        )
        self.tasks = rq_tasks
        if not self.simple:  # a forked job process exits at once: count each job directly
            os.environ["BENCH_SYNC_DONE"] = "1"
        self.q = rq.Queue("bench", connection=Redis.from_url(self.url))

    def enqueue(self, i):
        self.q.enqueue(self.tasks.noop)

    def enqueue_stamp(self, i):
        self.q.enqueue(self.tasks.stamp, i)

    def enqueue_bulk(self, n):
        prep = self.q.prepare_data
        self.q.enqueue_many([prep(self.tasks.noop) for _ in range(n)])

    def worker_cmds(self):
        rq_bin = os.path.join(os.path.dirname(sys.executable), "rq")
        cmd = [rq_bin, "worker", "--url", self.url, "--quiet"]
        if self.simple:
            cmd += ["--worker-class", "rq.SimpleWorker"]
        return [
            cmd + ["--name", f"bench-{os.getpid()}-{k}", "bench"] for k in range(self.args.workers)
        ]


def _extra(p):
    p.add_argument("--mode", choices=["fork", "simple"], default="fork")


if __name__ == "__main__":
    sys.exit(common.main(RqAdapter, extra_args=_extra))
