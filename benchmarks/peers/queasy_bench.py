"""queasy_py: one supervisor (`Client(url, workers=2)`, listen size 10) started as a subprocess,
stopped with SIGTERM. Run by the project's python, not the peers venv.

If queasy_py is not importable, or a queasy_py call fails, or the supervisor exits on its own,
the metric is reported as unavailable (value null) rather than as a crash of this script."""

from __future__ import annotations

import os
import sys
import traceback

import common

sys.path.insert(1, common.REPO)  # queasy_py from the source tree when it is not installed


class QueasyAdapter(common.Adapter):
    lib = "queasy_py"
    mode = "1 supervisor, `Client(workers={w})`, listen size {s}"
    #: the units a job takes of a worker's 100 (defaults.WORKER_UNITS): 10 jobs at once per
    #: worker, as bullmq's, saq's and arq's concurrency of 10 per process here
    size = 10
    has_bulk = True

    def __init__(self, args):
        super().__init__(args)
        try:
            import queasy_py
        except Exception as exc:
            raise common.Unavailable(
                f"queasy_py not importable: {type(exc).__name__}: {exc}"
            ) from exc
        self.version = getattr(queasy_py, "__version__", None) or _dist_version()
        self.client = queasy_py.Client(self.url, workers=0)
        self.q = self.client.queue("bench")

    def close(self):
        self.client.close()

    def enqueue(self, i):
        self.q.dispatch({})

    def enqueue_stamp(self, i):
        self.q.dispatch({"i": i})

    def enqueue_bulk(self, n):
        self.q.dispatch_many([{"data": {}} for _ in range(n)])

    def worker_cmds(self):
        script = os.path.join(common.HERE, "queasy_supervisor.py")
        return [[sys.executable, script, str(self.args.workers), str(self.size)]]

    def classify(self, exc):
        if isinstance(exc, (common.Unavailable, common.WorkersDied)):
            return "unavailable"
        for frame, _ in traceback.walk_tb(exc.__traceback__):
            if f"{os.sep}queasy_py{os.sep}" in frame.f_code.co_filename:
                return "unavailable"
        return "crash"


def _dist_version():
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("queasy_py")
    except PackageNotFoundError:
        return "source"


if __name__ == "__main__":
    sys.exit(common.main(QueasyAdapter))
