"""dramatiq: `dramatiq tasks.dramatiq_tasks --processes 2 --threads 8` (2: --workers)."""

from __future__ import annotations

import os
import sys

import common


class DramatiqAdapter(common.Adapter):
    lib = "dramatiq"
    mode = "`dramatiq --processes {w} --threads 8`"

    def __init__(self, args):
        super().__init__(args)
        import dramatiq
        from tasks import dramatiq_tasks

        self.version = dramatiq.__version__
        self.tasks = dramatiq_tasks

    def enqueue(self, i):
        self.tasks.noop.send()

    def enqueue_stamp(self, i):
        self.tasks.stamp.send(i)

    def close(self):
        self.tasks.broker.close()

    def worker_cmds(self):
        bin_ = os.path.join(os.path.dirname(sys.executable), "dramatiq")
        return [
            [bin_, "tasks.dramatiq_tasks", "--processes", str(self.args.workers), "--threads", "8"]
        ]


if __name__ == "__main__":
    sys.exit(common.main(DramatiqAdapter))
