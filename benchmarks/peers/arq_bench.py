"""arq: two `arq tasks.arq_tasks.WorkerSettings` processes (arq has no multi-process flag; its
docs scale out by running more worker processes)."""

from __future__ import annotations

import os
import sys

import common


class ArqAdapter(common.Adapter):
    lib = "arq"
    mode = "{w} x `arq WorkerSettings` (max_jobs 10 each)"

    def __init__(self, args):
        super().__init__(args)
        from importlib.metadata import version

        self.version = version("arq")
        self.pool = None

    async def connect(self):
        from arq import create_pool
        from arq.connections import RedisSettings

        self.pool = await create_pool(RedisSettings.from_dsn(self.url))

    async def close(self):
        if self.pool is not None:
            await self.pool.aclose()

    async def enqueue(self, i):
        await self.pool.enqueue_job("noop")

    async def enqueue_stamp(self, i):
        await self.pool.enqueue_job("stamp", i)

    def worker_cmds(self):
        bin_ = os.path.join(os.path.dirname(sys.executable), "arq")
        return [[bin_, "tasks.arq_tasks.WorkerSettings"] for _ in range(self.args.workers)]


if __name__ == "__main__":
    sys.exit(common.main(ArqAdapter))
