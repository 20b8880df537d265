"""saq: `saq tasks.saq_tasks.settings --workers 2`."""

from __future__ import annotations

import os
import sys

import common


class SaqAdapter(common.Adapter):
    lib = "saq"
    mode = "`saq --workers {w}` (concurrency 10 each)"

    def __init__(self, args):
        super().__init__(args)
        import saq

        self.version = getattr(saq, "__version__", None) or _dist_version("saq")
        self.queue = saq.Queue.from_url(self.url, name="bench")

    async def connect(self):
        await self.queue.connect()

    async def close(self):
        await self.queue.disconnect()

    async def enqueue(self, i):
        await self.queue.enqueue("noop")

    async def enqueue_stamp(self, i):
        await self.queue.enqueue("stamp", i=i)

    def worker_cmds(self):
        bin_ = os.path.join(os.path.dirname(sys.executable), "saq")
        return [[bin_, "tasks.saq_tasks.settings", "--workers", str(self.args.workers), "--quiet"]]


def _dist_version(name):
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    sys.exit(common.main(SaqAdapter))
