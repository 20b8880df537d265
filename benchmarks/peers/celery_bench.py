"""celery: one `celery worker` with the prefork pool, concurrency 2 (celery's documented default
pool; concurrency defaults to the CPU count, 2 here)."""

from __future__ import annotations

import os
import sys

import common


class CeleryAdapter(common.Adapter):
    lib = "celery"
    mode = "`celery worker -P prefork -c {w}`"

    def __init__(self, args):
        super().__init__(args)
        import celery
        from tasks import celery_tasks

        self.version = celery.__version__
        self.tasks = celery_tasks

    def enqueue(self, i):
        self.tasks.noop.delay()

    def enqueue_stamp(self, i):
        self.tasks.stamp.delay(i)

    def close(self):
        self.tasks.app.close()

    def worker_cmds(self):
        celery_bin = os.path.join(os.path.dirname(sys.executable), "celery")
        return [
            [
                celery_bin,
                "-A",
                "tasks.celery_tasks",
                "worker",
                "-P",
                "prefork",
                "-c",
                str(self.args.workers),
                "-l",
                "WARNING",
            ]
        ]


if __name__ == "__main__":
    sys.exit(common.main(CeleryAdapter))
