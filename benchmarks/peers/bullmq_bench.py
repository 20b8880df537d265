"""bullmq (Python package): 2 processes of one Worker(concurrency=10) (tasks/bullmq_worker.py)."""

from __future__ import annotations

import os
import sys

import common


class BullmqAdapter(common.Adapter):
    lib = "bullmq"
    mode = "{w} processes x `Worker(concurrency=10)`"
    has_bulk = True

    def __init__(self, args):
        super().__init__(args)
        from importlib.metadata import version

        import bullmq

        self.version = version("bullmq")
        self.queue = bullmq.Queue("bench", {"connection": self.url})

    async def close(self):
        await self.queue.close()

    async def enqueue(self, i):
        await self.queue.add("noop", {})

    async def enqueue_stamp(self, i):
        await self.queue.add("stamp", {"i": i})

    async def enqueue_bulk(self, n):
        await self.queue.addBulk([{"name": "noop", "data": {}} for _ in range(n)])

    def worker_cmds(self):
        script = os.path.join(common.HERE, "tasks", "bullmq_worker.py")
        return [[sys.executable, script] for _ in range(self.args.workers)]


if __name__ == "__main__":
    sys.exit(common.main(BullmqAdapter))
