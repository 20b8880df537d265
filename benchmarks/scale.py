"""Scale benchmark of queasy_py alone: how throughput grows with workers and queues, whether
CPU-bound handlers run in parallel, what a job costs each process, and whether memory stays
flat over a million jobs.

    python benchmarks/scale.py [--n 20000] [--repeat 3] [--cpu-jobs 200] [--rss-jobs 1000000]
                               [--max-workers N] [--parts throughput,costs,rss] [--smoke]

Starts its own valkey-server (run.py's Server), then, each scenario --repeat times (medians):

1. no-op jobs/s with 1 vs 2 worker processes (one queue, size 10);
2. no-op jobs/s with 1 vs 4 busy queues of equal priority (the same N jobs split evenly),
   one supervisor listening on all of them, 2 workers;
3. CPU-bound jobs/s (a ~20 ms pure-Python loop, calibrated here at start-up, size 100 so one
   job per worker at a time) with 1 vs 2 workers;
4. supervisor and per-worker RSS (psutil) over --rss-jobs no-op jobs, dispatched in chunks
   while the supervisor runs, with a bounded backlog;
5. (part `costs`) jobs/s and the CPU per job of the server (INFO commandstats: FCALL usec;
   and its process CPU), of the supervisor(s) and of the workers, for 1, 2, 4 and 8
   supervisors on one queue (one worker each), 1, 4 and 16 busy queues (one supervisor, 2
   workers) and 1..--max-workers workers (one supervisor, one queue; default the core
   count; --worker-counts picks some), so the same command on a bigger machine draws the
   scaling curve. With --max-workers of 4 or more, also the N workers split over 2 and
   over 4 supervisors. Listen size 10: 10 jobs at once per worker.

Prints Markdown tables and replaces (or appends) the "## Scale (queasy_py only)" section of
benchmarks/RESULTS.md (parts throughput and rss) and its "## Scale: CPU per job" section
(part costs). --smoke runs tiny sizes once, writes nothing, and exits 1 only if a run
crashed. Each supervisor is a subprocess of this script (`scale.py --supervise SPEC`) in its own
process group, killed at the end of its run; every wait has a deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "RESULTS.md")
SECTION = "## Scale (queasy_py only)"
SECTION_COSTS = "## Scale: CPU per job (queasy_py only)"
PARTS = ("throughput", "costs", "rss")
NOOP = "benchmarks.peers.tasks.queasy_noop"
CPU = "benchmarks.peers.tasks.queasy_cpu"
CPU_MS = 20.0  # target duration of one CPU-bound job
WINDOW_FROM = 0.10  # pre-dispatched runs: the rate is timed from 10% done to 100% done
DISPATCH_CHUNK = 5000  # jobs per dispatch_many call
MAX_BACKLOG = 40000  # RSS run: dispatched - done stays below this
MiB = 1024 * 1024

# Loaded by _load() (not at import time, so that a `--supervise` process stays lean: its RSS is
# one of the figures).
harness = common = queasy_py = redis = psutil = None


def _load() -> None:
    global harness, common, queasy_py, redis, psutil
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    import psutil as _psutil
    import redis as _redis

    import queasy_py as _queasy_py
    from benchmarks import run as _harness
    from benchmarks.peers import common as _common

    harness, common, queasy_py, redis, psutil = _harness, _common, _queasy_py, _redis, _psutil


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the supervisor subprocess -------------------------------------------------------------------


def supervise(spec_json: str) -> int:
    """`scale.py --supervise SPEC`: one Client(workers=N) listening on every queue of SPEC with
    the same handler and size, priority 100; runs until SIGTERM."""
    from queasy_py import Client

    spec = json.loads(spec_json)
    client = Client(os.environ["BENCH_REDIS_URL"], workers=spec["workers"])
    for name in spec["queues"]:
        client.queue(name).listen(spec["handler"], size=spec["size"], priority=100, timeout=60.0)
    try:
        return client.run() or 0
    finally:
        client.close()


class Supervisor:
    """A `--supervise` subprocess through common.Workers (own process group, SIGTERM then
    SIGKILL of the group on stop)."""

    def __init__(self, url: str, workers: int, queues: list[str], handler: str, size: int):
        spec = {"workers": workers, "queues": queues, "handler": handler, "size": size}
        cmd = [sys.executable, os.path.abspath(__file__), "--supervise", json.dumps(spec)]
        self.group = common.Workers([cmd], url)
        self.workers = workers

    def __enter__(self) -> Supervisor:
        self.group.start()
        return self

    def __exit__(self, *exc) -> None:
        self.group.stop(grace=10.0)
        self.group.cleanup()

    @property
    def pid(self) -> int:
        return self.group.procs[0].pid

    def check(self, deadline: float, what: str) -> None:
        if self.group.all_exited():
            raise RuntimeError(f"the supervisor exited while {what}: {self.group.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"deadline passed while {what}")

    def children(self) -> list:
        try:
            return psutil.Process(self.pid).children()
        except psutil.Error:
            return []

    def wait_idle_workers(self, deadline: float) -> None:
        """Until all worker processes exist and have stopped using CPU (imports done)."""
        while len(self.children()) < self.workers:
            self.check(deadline, "waiting for the worker processes")
            time.sleep(0.05)
        time.sleep(0.3)
        last = None
        while True:
            self.check(deadline, "waiting for the workers to go idle")
            total = sum(self.workers_cpu().values())
            if last is not None and total - last < 0.01:
                return
            last = total
            time.sleep(0.25)

    def workers_cpu(self) -> dict[int, float]:
        """CPU seconds (user + system) used so far by each worker process, by pid."""
        out = {}
        for p in self.children():
            try:
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
            except psutil.Error:
                pass
        return out

    def cores(self, cpu0: dict[int, float], seconds: float) -> list[float]:
        """Each worker's CPU seconds since cpu0 per wall second (a worker new since then: all
        its CPU time)."""
        cpu1 = self.workers_cpu()
        return [(cpu1[pid] - cpu0.get(pid, 0.0)) / seconds for pid in sorted(cpu1)]

    def rss(self) -> dict[str, int]:
        """RSS in bytes of the supervisor ("supervisor") and of each worker (by pid)."""
        out = {"supervisor": psutil.Process(self.pid).memory_info().rss}
        for p in sorted(self.children(), key=lambda p: p.pid):
            try:
                out[str(p.pid)] = p.memory_info().rss
            except psutil.Error:
                pass
        return out


# --- one run -------------------------------------------------------------------------------------


def done(r) -> int:
    return int(r.get(common.DONE_KEY) or 0)


def dispatch(client, jobs: dict[str, list]) -> None:
    """Every queue's jobs through dispatch_many, DISPATCH_CHUNK at a time."""
    for name, datas in jobs.items():
        q = client.queue(name)
        for k in range(0, len(datas), DISPATCH_CHUNK):
            q.dispatch_many([{"data": d} for d in datas[k : k + DISPATCH_CHUNK]])


def wait_done(r, sup: Supervisor, target: int, deadline: float, marks: dict[int, tuple]):
    """Poll the counter every 5 ms until it reaches target; marks[k] gets (time, count) of the
    first poll that saw at least k done."""
    while True:
        n = done(r)
        now = time.perf_counter()
        for k in marks:
            if marks[k] is None and n >= k:
                marks[k] = (now, n)
        if n >= target:
            return now
        sup.check(deadline, f"waiting for {target} jobs ({n} done)")
        time.sleep(0.005)


def run_throughput(url, r, workers, queues, handler, size, datas, budget, predispatch) -> tuple:
    """jobs/s of one supervisor over `datas` split evenly across `queues`.

    predispatch: jobs are queued before the supervisor starts, and timed from WINDOW_FROM done
    to all done (worker start-up left out, the producer idle). Otherwise the supervisor starts
    first, its workers are left to go idle, then the jobs are dispatched and timed from the
    dispatch to all done (for few, long jobs).

    Returns (jobs/s, each worker's CPU seconds per wall second over the timed span)."""
    r.flushdb()
    n = len(datas)
    jobs = {q: datas[i :: len(queues)] for i, q in enumerate(queues)}
    deadline = time.monotonic() + budget
    with queasy_py.Client(url, workers=0) as client:
        if predispatch:
            dispatch(client, jobs)  # before the supervisor starts
        with Supervisor(url, workers, queues, handler, size) as sup:
            return _timed(r, client, sup, jobs, n, deadline, predispatch)


def _timed(r, client, sup: Supervisor, jobs, n: int, deadline: float, predispatch) -> tuple:
    if predispatch:
        start = max(1, int(n * WINDOW_FROM))
        marks = {start: None}
        wait_done(r, sup, start, deadline, marks)
        cpu0 = sup.workers_cpu()
        t_end = wait_done(r, sup, n, deadline, {})
        t0, n0 = marks[start]
        if t_end <= t0:
            raise RuntimeError(f"{n} jobs too few to time: use a larger --n")
        return (n - n0) / (t_end - t0), sup.cores(cpu0, t_end - t0)
    sup.wait_idle_workers(deadline)
    cpu0 = sup.workers_cpu()
    t0 = time.perf_counter()
    dispatch(client, jobs)
    t_end = wait_done(r, sup, n, deadline, {})
    return n / (t_end - t0), sup.cores(cpu0, t_end - t0)


def run_rss(url, r, total: int, budget: float) -> dict:
    """One supervisor (2 workers, size 10) over `total` no-op jobs dispatched in chunks while it
    runs, keeping dispatched - done under MAX_BACKLOG; RSS samples along the way."""
    r.flushdb()
    deadline = time.monotonic() + budget
    points = {"start": 1, "10%": total // 10, "50%": total // 2, "end": total}
    samples: dict[str, dict] = {}
    sent = 0
    with (
        queasy_py.Client(url, workers=0) as client,
        Supervisor(url, 2, ["scale-rss"], NOOP, 10) as sup,
    ):
        q = client.queue("scale-rss")
        t0 = time.perf_counter()
        while len(samples) < len(points):
            n = done(r)
            for label, at in points.items():
                if label not in samples and n >= at:
                    samples[label] = {"done": n, "rss": sup.rss()}
            if sent < total and sent - n < MAX_BACKLOG:
                k = min(DISPATCH_CHUNK, total - sent)
                q.dispatch_many([{"data": {}} for _ in range(k)])
                sent += k
                continue
            sup.check(deadline, f"processing the RSS run ({n}/{total} done)")
            time.sleep(0.005)
        seconds = time.perf_counter() - t0
        redis_mem = r.info("memory").get("used_memory", 0)
    return {"samples": samples, "seconds": seconds, "jobs": total, "redis_mem": redis_mem}


# --- CPU per job ---------------------------------------------------------------------------------


def cpu_of(proc) -> float:
    """CPU seconds (user + system) of one process so far; 0.0 once it is gone."""
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


def fcall_usec(r) -> int:
    """The server's usec in FCALL so far (INFO commandstats)."""
    return int(r.info("commandstats").get("cmdstat_fcall", {}).get("usec", 0))


def fcall_calls(r) -> int:
    """FCALLs the server ran so far (INFO commandstats): a round is one dequeue per queue
    asked and one finish; rounds spinning empty would show as more calls per job."""
    return int(r.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))


def cost_snapshot(r, server_pid: int, sups: list[Supervisor]) -> dict:
    workers = [p for sup in sups for p in sup.children()]
    return {
        "fcall": fcall_usec(r),
        "calls": fcall_calls(r),
        "server": cpu_of(psutil.Process(server_pid)),
        "supervisors": sum(cpu_of(psutil.Process(sup.pid)) for sup in sups),
        "workers": {p.pid: cpu_of(p) for p in workers},
    }


def run_costs(
    url, r, server_pid: int, sups: int, workers: int, queues: list[str], n: int, budget: float
) -> dict:
    """`sups` supervisors (each `workers` workers, listening on every queue) over n no-op jobs
    split evenly across `queues`, dispatched before they start; jobs/s and the CPU per job
    of each side, over the span from WINDOW_FROM done to all done."""
    r.flushdb()
    datas = [{}] * n
    jobs = {q: datas[i :: len(queues)] for i, q in enumerate(queues)}
    deadline = time.monotonic() + budget
    with queasy_py.Client(url, workers=0) as client:
        dispatch(client, jobs)
    group = [Supervisor(url, workers, queues, NOOP, 10) for _ in range(sups)]
    started: list[Supervisor] = []
    try:
        for sup in group:
            started.append(sup.__enter__())
        first = started[0]
        start = max(1, int(n * WINDOW_FROM))
        marks = {start: None}
        wait_done(r, first, start, deadline, marks)
        before = cost_snapshot(r, server_pid, started)
        t_end = wait_done(r, first, n, deadline, {})
        after = cost_snapshot(r, server_pid, started)
        for sup in started:
            sup.check(deadline, "finishing the run")
    finally:
        for sup in reversed(started):
            sup.__exit__(None, None, None)
    t0, n0 = marks[start]
    jobs_timed = n - n0
    if t_end <= t0 or jobs_timed <= 0:
        raise RuntimeError(f"{n} jobs too few to time: use a larger --n")
    w0 = before["workers"]
    workers_cpu = sum(v - w0.get(pid, 0.0) for pid, v in after["workers"].items())
    per_job = 1e6 / jobs_timed
    return {
        "rate": jobs_timed / (t_end - t0),
        "fcall": (after["fcall"] - before["fcall"]) / jobs_timed,
        "calls": (after["calls"] - before["calls"]) / jobs_timed,
        "server": (after["server"] - before["server"]) * per_job,
        "supervisors": (after["supervisors"] - before["supervisors"]) * per_job,
        "workers": workers_cpu * per_job,
    }


def cost_scenarios(args) -> list[dict]:
    """The runs of the costs part: (key, label, run_costs kwargs)."""
    out = []
    for k in (1, 2, 4, 8):
        out.append(
            dict(
                key=f"sup-{k}",
                label=f"{k} supervisor(s) × 1 worker, 1 queue",
                sups=k,
                workers=1,
                queues=["scale-a"],
            )
        )
    for q in (1, 4, 16):
        out.append(
            dict(
                key=f"q-{q}",
                label=f"1 supervisor × 2 workers, {q} busy queue(s)",
                sups=1,
                workers=2,
                queues=[f"scale-q{i}" for i in range(q)],
            )
        )
    counts = args.worker_counts or list(range(1, args.max_workers + 1))
    for k in (2, 4):  # a many-core machine's workers split over several supervisors
        if args.max_workers >= 2 * k:
            w = args.max_workers // k
            out.append(
                dict(
                    key=f"sup-{k}x{w}",
                    label=f"{k} supervisors × {w} workers, 1 queue",
                    sups=k,
                    workers=w,
                    queues=["scale-a"],
                )
            )
    for w in counts:
        out.append(
            dict(
                key=f"w-{w}",
                label=f"1 supervisor × {w} worker(s), 1 queue",
                sups=1,
                workers=w,
                queues=["scale-a"],
            )
        )
    return out  # fmt: skip


COST_FIELDS = ("rate", "fcall", "server", "supervisors", "workers", "calls")


def costs_table(plan: list[dict], costs: dict[str, list[dict]]) -> list[str]:
    lines = [
        "| scenario | jobs/s | server FCALL µs/job (commandstats) | server process CPU µs/job"
        " | supervisor(s) CPU µs/job | workers CPU µs/job | FCALLs per job |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in plan:
        runs = costs[s["key"]]
        vals = [median([run[f] for run in runs]) for f in COST_FIELDS]
        lines.append(
            f"| {s['label']} | {fmt(vals[0])} | "
            + " | ".join(fmt(v, 1) for v in vals[1:-1])
            + f" | {fmt(vals[-1], 3)} |"
        )
    return lines


# --- CPU calibration -----------------------------------------------------------------------------


def calibrate() -> tuple[int, float]:
    """Loop count of queasy_cpu.spin() that takes CPU_MS here (best of several timings, so a
    noisy neighbour makes it longer, not shorter); returns (loops, measured ms)."""
    from benchmarks.peers.tasks.queasy_cpu import spin

    def best(loops: int, tries: int) -> float:
        times = []
        for _ in range(tries):
            t = time.perf_counter()
            spin(loops)
            times.append(time.perf_counter() - t)
        return min(times)

    probe = 50_000
    loops = max(1, round(probe * (CPU_MS / 1000.0) / best(probe, 7)))
    return loops, best(loops, 5) * 1000.0


# --- the scenarios -------------------------------------------------------------------------------


def scenarios(args, cpu_loops: int) -> list[dict]:
    """(key, description, run kwargs). Keys pair up into the ratio rows of the report."""
    noop = [{}] * args.n
    cpu = [{"loops": cpu_loops}] * args.cpu_jobs
    four = [f"scale-{c}" for c in "abcd"]
    return [
        dict(key="noop-1w", workers=1, queues=["scale-a"], handler=NOOP, size=10, datas=noop,
             predispatch=True),
        dict(key="noop-2w", workers=2, queues=["scale-a"], handler=NOOP, size=10, datas=noop,
             predispatch=True),
        dict(key="noop-2w-4q", workers=2, queues=four, handler=NOOP, size=10, datas=noop,
             predispatch=True),
        dict(key="cpu-1w", workers=1, queues=["scale-a"], handler=CPU, size=100, datas=cpu,
             predispatch=False),
        dict(key="cpu-2w", workers=2, queues=["scale-a"], handler=CPU, size=100, datas=cpu,
             predispatch=False),
    ]  # fmt: skip


def median(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


# --- report --------------------------------------------------------------------------------------


def fmt(v: float | None, digits: int = 0) -> str:
    return "n/a" if v is None else f"{v:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or a == 0 else f"{b / a:.2f}×"


def throughput_table(args, res: dict, cores: dict, cpu_loops: int, cpu_ms: float) -> list[str]:
    def runs(key):
        return ", ".join(fmt(v) for v in res[key]) or "—"

    rows = [
        (
            f"no-op, 1 queue (size 10), {args.n:,} jobs",
            "1 worker", "noop-1w", "2 workers", "noop-2w", "",
        ),
        (
            f"no-op, 2 workers (size 10), {args.n:,} jobs",
            "1 busy queue", "noop-2w", "4 busy queues (N/4 each, same priority)", "noop-2w-4q",
            "",
        ),
        (
            f"CPU-bound {cpu_ms:.1f} ms loop ({cpu_loops:,} iterations), size 100,"
            f" {args.cpu_jobs:,} jobs",
            "1 worker", "cpu-1w", "2 workers", "cpu-2w", " (target ≥ 1.80×)",
        ),
    ]  # fmt: skip
    lines = [
        "| scenario | A | A jobs/s | B | B jobs/s | B / A | workers' CPU use A / B (cores)"
        " | runs A; runs B (jobs/s) |",
        "|---|---|---:|---|---:|---:|---:|---|",
    ]
    for desc, la, ka, lb, kb, target in rows:
        a, b = median(res[ka]), median(res[kb])
        lines.append(
            f"| {desc} | {la} | {fmt(a)} | {lb} | {fmt(b)} | {ratio(a, b)}{target}"
            f" | {fmt(median(cores[ka]), 2)} / {fmt(median(cores[kb]), 2)}"
            f" | {runs(ka)}; {runs(kb)} |"
        )
    return lines


def rss_table(rss: dict | None) -> list[str]:
    if not rss:
        return ["(no RSS run result)"]
    s = rss["samples"]
    names = list(s["start"]["rss"])  # supervisor first, then the workers by pid
    lines = [
        "| process | RSS at start (MiB) | after 10% | after 50% "
        f"| after {rss['jobs']:,} jobs | growth start → end | growth 10% → end |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        vals = [s[p]["rss"].get(name) for p in ("start", "10%", "50%", "end")]
        mib = [None if v is None else v / MiB for v in vals]
        label = name if name == "supervisor" else f"worker (pid {name})"
        growth = [
            "n/a" if mib[i] is None or mib[3] is None else f"{mib[3] - mib[i]:+.1f}" for i in (0, 1)
        ]
        lines.append(f"| {label} | " + " | ".join([fmt(m, 1) for m in mib] + growth) + " |")
    replaced = set(s["end"]["rss"]) != set(names)
    lines += [
        "",
        f"{rss['jobs']:,} no-op jobs (2 workers, size 10) in {rss['seconds']:.1f} s"
        f" ({rss['jobs'] / rss['seconds']:,.0f} jobs/s including the producer's dispatch_many"
        f" calls of {DISPATCH_CHUNK:,} on the same cores), backlog kept under {MAX_BACKLOG:,};"
        f" Redis used_memory at the end {rss['redis_mem'] / MiB:.1f} MiB."
        + (" The worker pids changed during the run (a worker was replaced)." if replaced else
           " The same worker processes ran from start to end."),
    ]  # fmt: skip
    return lines


def report(args, res, cores, rss, errors, cpu_loops, cpu_ms) -> str:
    lines = [
        f"### Throughput (median of {args.repeat} run(s))",
        "",
        *throughput_table(args, res, cores, cpu_loops, cpu_ms),
        "",
        "### Memory over a long run",
        "",
        *rss_table(rss),
    ]
    if errors:
        lines += ["", "Errors:", ""] + [f"- {e}" for e in errors]
    return "\n".join(lines)


def notes(args) -> list[str]:
    return [
        "- One supervisor subprocess per run (`Client(workers=W)`, `listen(..., priority=100,"
        " timeout=60)` on every queue), each run in a flushed db of one valkey-server; the"
        " no-op handler counts itself done through a counter flushed with INCRBY every 5 ms"
        " (as in run.py).",
        f"- no-op rows: the N jobs are dispatched before the supervisor starts; the rate is timed"
        f" from {WINDOW_FROM:.0%} done to all done, so process start-up is left out and the"
        " producer is idle. The 2-worker one-queue runs serve as B of the first row and A of the"
        " second (the same configuration); runs are interleaved A, B, C per repeat.",
        "- CPU-bound rows: the supervisor starts first and its workers are left to go idle; then"
        " the jobs are dispatched and timed from the dispatch to the last one done. The loop"
        " count is calibrated at start-up (best of several timings in this process). size 100 ="
        " one job per worker at a time; each worker runs it in its own process (own GIL).",
        "- workers' CPU use: CPU seconds of the worker processes over the timed span divided by"
        " its length (2.00 = both cores busy in handler processes); it tells a runtime that"
        " serialises work from a machine whose cores were taken by something else.",
        "- Memory: RSS of the supervisor process and of each of its worker children (psutil),"
        " sampled when the first job was done, after 10% and 50% of the jobs and after all of"
        " them. Growth 10% → end leaves out the warm-up (first connections, allocator arenas).",
        "- A shared, noisy 2-core machine: the server, the producer, the supervisor and the"
        " workers share the cores; compare ratios within the run, not small differences.",
    ]


def cost_notes() -> list[str]:
    return [
        f"- Each run: {'{'}N{'}'} no-op jobs (size 10) dispatched before the supervisors start,"
        f" timed from {WINDOW_FROM:.0%} done to all done; CPU is the difference of each"
        " process's user + system seconds (psutil) over that span, divided by the jobs done"
        " in it. Server FCALL is INFO commandstats' usec of FCALL (the library's own time);"
        " the server process also answers the no-op handlers' done counters and this"
        " script's polls.",
        "- Several supervisors: each is its own process with one worker, all listening on the"
        " same queue; their CPU is summed. Queues: one supervisor listening on all of them at"
        " the same priority, the jobs split evenly.",
        "- CPU per job does not depend much on the machine's load (unlike jobs/s): compare"
        " these columns across runs and machines.",
    ]


def write_section(body: str, path: str = RESULTS, section: str = SECTION) -> None:
    """Replace `section` of `path` (up to the next level-2 heading), or append it."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = "# Benchmark results\n"
    lines = text.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip() == section)
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines)
        )
        head, tail = lines[:start], lines[end:]
    except StopIteration:
        head, tail = lines, []
    while head and not head[-1].strip():
        head.pop()
    new = head + ["", *body.rstrip("\n").splitlines(), ""]
    if tail:
        new += tail
    with open(path, "w") as f:
        f.write("\n".join(new).rstrip("\n") + "\n")


# --- main ----------------------------------------------------------------------------------------


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"worker counts are at least 1: {text!r}")
    return counts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--n", type=int, default=20000, help="no-op jobs per throughput run")
    p.add_argument("--repeat", type=int, default=3, help="runs per scenario; medians are kept")
    p.add_argument("--cpu-jobs", type=int, default=200, help="jobs per CPU-bound run")
    p.add_argument("--rss-jobs", type=int, default=1_000_000, help="no-op jobs of the RSS run")
    p.add_argument("--timeout", type=float, default=300.0, help="budget of one run, s")
    p.add_argument("--rss-timeout", type=float, default=1800.0, help="budget of the RSS run, s")
    p.add_argument("--out", default=RESULTS, help="the report whose section is replaced")
    p.add_argument(
        "--max-workers", type=int, default=os.cpu_count() or 1,
        help="costs part: runs with 1..N workers (default: the core count)",
    )  # fmt: skip
    p.add_argument(
        "--worker-counts", type=_counts, default=None,
        help="costs part: the worker counts of the 1-supervisor runs, e.g. 1,2,4,8,16 "
        "(default 1..--max-workers)",
    )  # fmt: skip
    p.add_argument(
        "--parts", default=",".join(PARTS),
        help=f"comma-separated parts to run, of {', '.join(PARTS)} (default: all)",
    )  # fmt: skip
    p.add_argument("--smoke", action="store_true", help="tiny sizes, once; write nothing")
    args = p.parse_args(argv)
    parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    if not parts or parts - set(PARTS) or args.max_workers < 1:
        p.error(f"--parts takes some of {', '.join(PARTS)}; --max-workers at least 1")
    if args.smoke:
        args.n, args.repeat, args.cpu_jobs = min(args.n, 400), 1, min(args.cpu_jobs, 10)
        args.rss_jobs, args.timeout = min(args.rss_jobs, 3000), min(args.timeout, 120.0)
        args.rss_timeout = min(args.rss_timeout, 120.0)
        args.max_workers, args.worker_counts = min(args.max_workers, 2), None

    _load()
    harness.become_subreaper()
    server = harness.Server().start()
    keep = {server.proc.pid}

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    errors: list[str] = []
    rss = None
    try:
        url = server.url(0)
        r = redis.Redis.from_url(url, decode_responses=True)
        version = server.version()
        cpu_loops, cpu_ms = calibrate()
        log(
            f"valkey {version} on 127.0.0.1:{server.port}; n={args.n}, repeat={args.repeat};"
            f" CPU job = {cpu_loops:,} loops = {cpu_ms:.1f} ms"
        )
        plan = scenarios(args, cpu_loops) if "throughput" in parts else []
        res: dict[str, list] = {s["key"]: [] for s in plan}
        cores: dict[str, list] = {s["key"]: [] for s in plan}
        load = os.getloadavg()
        cost_plan = cost_scenarios(args) if "costs" in parts else []
        if args.smoke:  # one of each kind: several supervisors, several queues
            cost_plan = [c for c in cost_plan if c["key"] in ("sup-2", "q-4", "w-1")]
        costs: dict[str, list] = {c["key"]: [] for c in cost_plan}
        for k in range(args.repeat if cost_plan else 0):
            for c in cost_plan:
                kw = {x: v for x, v in c.items() if x not in ("key", "label")}
                t = time.monotonic()
                try:
                    got = run_costs(url, r, server.proc.pid, n=args.n, budget=args.timeout, **kw)
                except Exception as exc:  # noqa: BLE001 - reported, the other runs go on
                    errors.append(f"{c['key']} run {k + 1}: {type(exc).__name__}: {exc}")
                    log(f"{c['key']:11s} #{k + 1}: ERROR {errors[-1]}")
                else:
                    costs[c["key"]].append(got)
                    log(
                        f"{c['key']:11s} #{k + 1}: {got['rate']:,.0f} jobs/s; µs/job: server"
                        f" FCALL {got['fcall']:.1f}, process {got['server']:.1f};"
                        f" supervisor(s) {got['supervisors']:.1f}; workers {got['workers']:.1f};"
                        f" {got['calls']:.3f} FCALLs per job"
                        f" [{time.monotonic() - t:.1f} s]"
                    )
                harness.kill_strays(keep)
        for k in range(args.repeat):
            for s in plan:
                kw = {x: v for x, v in s.items() if x != "key"}
                t = time.monotonic()
                try:
                    v, each = run_throughput(url, r, budget=args.timeout, **kw)
                    c = sum(each)
                except Exception as exc:  # noqa: BLE001 - reported, the other runs go on
                    errors.append(f"{s['key']} run {k + 1}: {type(exc).__name__}: {exc}")
                    log(f"{s['key']:11s} #{k + 1}: ERROR {errors[-1]}")
                    v = c = None
                else:
                    log(
                        f"{s['key']:11s} #{k + 1}: {v:,.0f} jobs/s, workers using {c:.2f} cores"
                        f" ({' + '.join(f'{x:.2f}' for x in each)})"
                        f" [{time.monotonic() - t:.1f} s]"
                    )
                res[s["key"]].append(v)
                cores[s["key"]].append(c)
                harness.kill_strays(keep)
        if "rss" in parts:
            log(f"RSS run: {args.rss_jobs:,} no-op jobs ...")
            try:
                rss = run_rss(url, r, args.rss_jobs, args.rss_timeout)
                log(f"RSS run done in {rss['seconds']:.1f} s")
            except Exception as exc:  # noqa: BLE001
                errors.append(f"rss run: {type(exc).__name__}: {exc}")
                log(f"RSS run: ERROR {errors[-1]}")
            harness.kill_strays(keep)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        harness.kill_strays(keep)
        server.stop()

    body = report(args, res, cores, rss, errors, cpu_loops, cpu_ms) if plan or rss else ""
    cost_body = "\n".join(costs_table(cost_plan, costs)) if cost_plan else ""
    print("\n\n".join(b for b in (body, cost_body) if b))
    if args.smoke:
        log("smoke: " + ("FAILED" if errors else "ok"))
        return 1 if errors else 0

    cmd = f"python benchmarks/scale.py --n {args.n} --repeat {args.repeat}"
    cmd += f" --cpu-jobs {args.cpu_jobs} --rss-jobs {args.rss_jobs}"
    if parts != set(PARTS):
        cmd += f" --parts {','.join(p for p in PARTS if p in parts)}"
    head = [*harness.machine(version),
            "- load average when the run started (other work on the machine): "
            + " / ".join(f"{x:.2f}" for x in load)]  # fmt: skip
    if body:
        section = "\n".join(
            [SECTION, "", f"`{cmd}`", "", *head, "", body, "", "Notes:", "",
             *notes(args), "- See benchmarks/README.md for the method.", ""]
        )  # fmt: skip
        write_section(section, args.out)
    if cost_body:
        errs = [f"- {e}" for e in errors]
        wc = args.worker_counts
        counts = f" --worker-counts {','.join(map(str, wc))}" if wc else ""
        section = "\n".join(
            [SECTION_COSTS, "", f"`{cmd} --max-workers {args.max_workers}{counts}`", "", *head, "",
             f"Medians of {args.repeat} run(s).", "", cost_body, "",
             *(["Errors:", "", *errs, ""] if errs else []), "Notes:", "", *cost_notes(), ""]
        )  # fmt: skip
        write_section(section, args.out, SECTION_COSTS)
    log(f"wrote {args.out}")
    return 1 if errors else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--supervise"]:
        sys.exit(supervise(sys.argv[2]))
    sys.exit(main())
