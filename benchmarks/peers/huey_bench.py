"""huey: `huey_consumer tasks.huey_tasks.huey -w 2 -k process` (2: --workers)."""

from __future__ import annotations

import os
import sys

import common


class HueyAdapter(common.Adapter):
    lib = "huey"
    mode = "`huey_consumer -w {w} -k process`"

    def __init__(self, args):
        super().__init__(args)
        import huey
        from tasks import huey_tasks

        self.version = huey.__version__
        self.tasks = huey_tasks

    def enqueue(self, i):
        self.tasks.noop()

    def enqueue_stamp(self, i):
        self.tasks.stamp(i)

    def worker_cmds(self):
        bin_ = os.path.join(os.path.dirname(sys.executable), "huey_consumer")
        return [
            [bin_, "tasks.huey_tasks.huey", "-w", str(self.args.workers), "-k", "process", "-q"]
        ]


if __name__ == "__main__":
    sys.exit(common.main(HueyAdapter))
