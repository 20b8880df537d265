"""Start-up timeline: where the time from starting `queasy run` to its first job goes.

    python benchmarks/startup_timeline.py [--workers 2] [--repeat 5] [--repo PATH]

Like benchmarks/startup.py (a job waits in an empty queue of a private valkey-server, then
`queasy run` starts), but every process of the run marks the time of its steps in a file:
the supervisor (interpreter up, its imports, connecting and the library check, the
supervisor built, each worker started, the first heartbeat, the loop's first step, each
worker's "ready" read, the first job sent, the first results read) and each worker
(interpreter up, its import of queasy_py.runtime.worker). The marks come from a
sitecustomize module on PYTHONPATH (an audit hook for the imports and the first connect)
and from wrappers the supervisor's entry script puts around those methods; they cost a few
microseconds each. Printed: each step's median time after the start, its range, and the
load average. --repo runs another checkout's queasy_py (before/after comparisons).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bytecode import compile_queasy
from firstjob import run_first_job

REPO = Path(__file__).resolve().parent.parent

SITE = """
import os, sys, time
_file = os.environ.get("QTL_FILE")
if _file:
    def _mark(label, at=None):
        with open(_file, "a") as f:
            f.write(f"{os.getpid()} {at or time.time()!r} {label}\\n")
    _mark("interpreter up", time.time())
    _seen = set()
    _imports = {
        "queasy_py.runtime.worker": "worker: imports queasy_py.runtime.worker",
        "redis": "supervisor: imports redis-py",
        "queasy_py.runtime.supervisor": "supervisor: imports the runtime",
    }
    def _hook(event, args):
        if event == "import":
            # redis-py's own modules too: importlib.import_module("redis") raises no event
            name = "redis" if args[0].startswith("redis.") else args[0]
            if name in _imports and name not in _seen:
                _seen.add(name)
                _mark(_imports[name])
        elif event == "socket.connect" and "connect" not in _seen:
            _seen.add("connect")
            _mark("supervisor: first connect")
    sys.addaudithook(_hook)
    import builtins
    builtins._qtl_mark = _mark
"""

SUPERVISOR = """
import builtins, importlib.util, sys
mark = builtins._qtl_mark
def wrap(cls, name, label, before=False):
    inner, calls = getattr(cls, name), []
    def marked(*args, **kwargs):
        if before and not calls:
            mark(label)
        out = inner(*args, **kwargs)
        if not before and not calls:
            mark(label)
        calls.append(1)
        return out
    setattr(cls, name, marked)
def patch_pool(pool):
    wrap(pool.WorkerProc, "send", "supervisor: first job sent to a worker", before=True)
    start_worker = pool.start_worker
    def started(*args, **kwargs):
        proc = start_worker(*args, **kwargs)
        mark("supervisor: worker started")
        return proc
    pool.start_worker = started  # before early.py and workers.py import it
def patch_workers(workers):
    handle = workers.Workers._handle_message
    def message(self, proc, msg):
        mark("supervisor: a worker's ready read" if msg == "ready" else "supervisor: results read")
        return handle(self, proc, msg)
    workers.Workers._handle_message = message
def patch_supervisor(supervisor):
    wrap(supervisor.Supervisor, "__init__", "supervisor: built")
    wrap(supervisor.Supervisor, "_step", "supervisor: loop's first step", before=True)
PATCH = {
    "queasy_py.client": lambda m: wrap(m.Client, "ready", "supervisor: connected, library checked"),
    "queasy_py.runtime.pool": patch_pool,
    "queasy_py.runtime.workers": patch_workers,
    "queasy_py.runtime.heartbeat": lambda m: wrap(
        m.Heartbeat, "beat_or_reload", "supervisor: first heartbeat"),
    "queasy_py.runtime.supervisor": patch_supervisor,
}
class Patcher:  # wraps the methods as each module is imported, when the run imports it
    def find_spec(self, name, path, target=None):
        if name not in PATCH:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            PATCH[name](module)
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Patcher())
import queasy_py.cli.main
mark("supervisor: queasy_py.cli.main imported")
sys.exit(sys.modules["queasy_py.cli.main"].main(sys.argv[1:]))
"""

HANDLER = """
import time


def handle(data, job):
    with open(data["path"], "a") as f:
        f.write(f"{time.time()!r}\\n")
"""


def one_run(url: str, repo: Path, workers: int, tmp: Path, n: int) -> list[tuple[str, float]]:
    """The marks of one run: (label, seconds after the start), in time order; a label that
    several processes mark is numbered by its order ('... #2')."""
    from queasy_py import Client  # from --repo's checkout (main puts it first on sys.path)

    def dispatch(url: str, prefix: str, data: dict) -> None:
        with Client(url, prefix=prefix) as client:
            client.queue("start").dispatch(data)

    out, marks, prefix = tmp / f"ran-{n}.txt", tmp / f"marks-{n}.txt", f"timeline{n}"
    env = {**os.environ, "PYTHONPATH": f"{tmp / 'site'}{os.pathsep}{repo}", "QTL_FILE": str(marks)}
    entry = [str(tmp / "supervisor.py")]
    # linger: the marks that follow the job (the second worker's ready)
    started, done, sup_pid = run_first_job(
        url, prefix, workers, tmp, out, entry, env, dispatch, linger=0.2
    )
    rows = []
    for line in marks.read_text().splitlines():
        pid, at, label = line.split(" ", 2)
        if label == "interpreter up":
            label = (
                "supervisor: interpreter up" if int(pid) == sup_pid else "worker: interpreter up"
            )
        rows.append((float(at) - started, label))
    rows.append((done - started, "the first job ran"))
    rows.sort()
    counts: dict[str, int] = {}
    named = []
    for at, label in rows:
        counts[label] = counts.get(label, 0) + 1
        named.append((label if counts[label] == 1 else f"{label} #{counts[label]}", at))
    return named


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--repo", default=str(REPO), help="the checkout whose queasy_py runs")
    args = parser.parse_args()
    repo = Path(args.repo).resolve()
    sys.path.insert(0, str(repo))
    from queasy_py.store.embedded import EmbeddedServer

    compile_queasy()  # --repo's, as installed: its bytecode written (benchmarks/bytecode.py)
    load = os.getloadavg()
    runs = []
    with EmbeddedServer() as server, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "site").mkdir()
        (tmp / "site" / "sitecustomize.py").write_text(SITE)
        (tmp / "supervisor.py").write_text(SUPERVISOR)
        (tmp / "startup_handler.py").write_text(HANDLER)
        for n in range(args.repeat):
            runs.append(dict(one_run(server.url, repo, args.workers, tmp, n)))
    order = sorted(
        {k for run in runs for k in run},
        key=lambda k: statistics.median(run[k] for run in runs if k in run),
    )
    print(
        f"`queasy run` ({repo}), {args.workers} workers, {args.repeat} runs, {os.cpu_count()} "
        f"cores, load average {' / '.join(f'{x:.2f}' for x in load)} at start; seconds after "
        "the start, median (min-max):"
    )
    for key in order:
        times = sorted(run[key] for run in runs if key in run)
        print(f"  {statistics.median(times):6.3f} ({times[0]:.3f}-{times[-1]:.3f})  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
