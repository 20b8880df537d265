"""Shared plumbing for the benchmark adapters.

Each ``<lib>_bench.py`` defines an :class:`Adapter` subclass and calls :func:`main`. This module
owns the command line, the four metric procedures, the worker process groups and the single
JSON line every adapter prints. It needs only the standard library and ``redis`` (present in
both the peers venv and the project's venv).

Adapter methods (``enqueue``, ``enqueue_stamp``, ``enqueue_bulk``, ``connect``, ``close``) may be
plain functions or coroutines; everything runs inside one ``asyncio`` event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import redis

HERE = os.path.dirname(os.path.abspath(__file__))  # benchmarks/peers
REPO = os.path.dirname(os.path.dirname(HERE))  # repository root
DONE_KEY = "bench:done"  # INCR by every finished job
LAT_KEY = "bench:lat"  # HSET index -> handler start time (latency jobs)
METRICS = ("enqueue", "bulk", "process", "latency")
BULK_CHUNK = 1000  # jobs per bulk call


class Unavailable(Exception):
    """The library cannot run this metric here (not installed, not implemented, no such API)."""


class WorkersDied(RuntimeError):
    """Every worker process exited before the jobs were done."""


class BenchTimeout(Exception):
    """The per-run time budget ran out."""


class Partial(Exception):
    """The workers did not finish within the time budget; carries the rate reached so far."""

    def __init__(self, done: int, target: int, seconds: float):
        super().__init__(
            f"did not finish within the time budget: {done}/{target} done in {seconds:.1f} s"
        )
        self.rate = done / seconds if seconds > 0 else 0.0


_BUDGET_END = [float("inf")]  # perf_counter() by which a metric must give up (set by main)
_STOP_MARGIN = 20.0  # seconds kept back from --timeout for stopping workers and reporting


class Adapter:
    lib = "?"
    mode = "?"
    version = "?"
    has_bulk = False
    bulk_note = "no bulk API"

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.url = args.redis_url
        # a class's mode names its worker count as {w}: --workers
        self.mode = type(self).mode.format(w=args.workers, s=getattr(self, "size", None))

    # --- to override -------------------------------------------------------------------------
    def connect(self):  # may be async
        pass

    def close(self):  # may be async
        pass

    def enqueue(self, i: int):  # one no-op job; may be async
        raise NotImplementedError

    def enqueue_stamp(self, i: int):  # one latency job that records its start time; may be async
        raise NotImplementedError

    def enqueue_bulk(self, n: int):  # n no-op jobs through the bulk API; may be async
        raise Unavailable(self.bulk_note)

    def worker_cmds(self) -> list[list[str]]:
        """Commands that start the library's workers; each gets its own process group."""
        raise NotImplementedError

    def classify(self, exc: BaseException) -> str:
        """'unavailable' (value null, exit 0) or 'crash' (value null, exit 2)."""
        return "unavailable" if isinstance(exc, Unavailable) else "crash"


# --- command line and output ---------------------------------------------------------------------


def _positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def parse_args(argv=None, extra=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="one benchmark run of one job queue library")
    p.add_argument("--redis-url", required=True)
    p.add_argument("--metric", required=True, choices=METRICS)
    p.add_argument("--n", type=int, default=20000, help="jobs for enqueue/bulk/process")
    p.add_argument("--timeout", type=float, default=300.0, help="time budget of this run, s")
    p.add_argument("--latency-jobs", type=int, default=200)
    p.add_argument("--latency-gap-ms", type=float, default=10.0)
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=2,
        help="worker processes of the library (default 2; each adapter says how it maps)",
    )
    if extra:
        extra(p)
    return p.parse_args(argv)


def emit(adapter: Adapter, metric: str, value, unit: str, note: str = "", **extra) -> None:
    rec = {
        "lib": adapter.lib,
        "version": adapter.version,
        "mode": adapter.mode,
        "metric": metric,
        "value": None if value is None else round(float(value), 3),
        "unit": unit,
        "note": note,
    }
    rec.update(extra)
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()


UNITS = {"enqueue": "jobs/s", "bulk": "jobs/s", "process": "jobs/s", "latency": "ms"}


# --- worker process groups -----------------------------------------------------------------------


def worker_env(url: str) -> dict:
    env = dict(os.environ)
    parts = [HERE, REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["BENCH_REDIS_URL"] = url
    env["PYTHONUNBUFFERED"] = "1"
    return env


_LIVE: list[Workers] = []  # started and not yet stopped; main() stops them on any exit


class Workers:
    """Worker processes, each the leader of its own process group, all killed on stop()."""

    def __init__(self, cmds: list[list[str]], url: str):
        self.cmds = cmds
        self.url = url
        self.procs: list[subprocess.Popen] = []
        self.log = tempfile.NamedTemporaryFile(prefix="bench-workers-", suffix=".log", delete=False)

    def start(self) -> None:
        env = worker_env(self.url)
        _LIVE.append(self)
        for cmd in self.cmds:
            self.procs.append(
                subprocess.Popen(
                    cmd,
                    cwd=HERE,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=self.log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def all_exited(self) -> bool:
        return bool(self.procs) and all(p.poll() is not None for p in self.procs)

    def log_tail(self, lines: int = 6) -> str:
        try:
            with open(self.log.name, errors="replace") as f:
                tail = f.read().splitlines()[-lines:]
        except OSError:
            return ""
        return " | ".join(s.strip() for s in tail if s.strip())[:600]

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every group (clean stop), then SIGKILL whatever is left of the groups."""
        for p in self.procs:
            _killpg(p.pid, signal.SIGTERM)
        end = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            _killpg(p.pid, signal.SIGKILL)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []
        if self in _LIVE:
            _LIVE.remove(self)

    def cleanup(self) -> None:
        try:
            self.log.close()
            os.unlink(self.log.name)
        except OSError:
            pass


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --- metric procedures ---------------------------------------------------------------------------


async def _call(fn, *a):
    res = fn(*a)
    if inspect.isawaitable(res):
        res = await res
    return res


async def _enqueue_loop(fn, n: int) -> float:
    """Seconds to call fn(i) for i in range(n); a coroutine function is awaited each time."""
    if inspect.iscoroutinefunction(fn):
        t0 = time.perf_counter()
        for i in range(n):
            await fn(i)
        return time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return time.perf_counter() - t0


def _done(r: redis.Redis) -> int:
    return int(r.get(DONE_KEY) or 0)


async def _wait_done(
    r: redis.Redis,
    target: int,
    workers: Workers,
    first: list | None = None,
    t0: float | None = None,
) -> float:
    """Poll the counter every 5 ms until it reaches target; returns perf_counter() at that point.
    Past the budget raises Partial (rate since t0)."""
    while True:
        n = _done(r)
        now = time.perf_counter()
        if first is not None and not first and n > 0:
            first.append((now, n))
        if n >= target:
            return now
        if workers.all_exited():
            raise WorkersDied(
                f"all worker processes exited ({n}/{target} done): {workers.log_tail()}"
            )
        if now > _BUDGET_END[0]:
            if t0 is None:
                raise BenchTimeout(f"timed out waiting for {target} jobs ({n} done)")
            raise Partial(n, target, now - t0)
        await asyncio.sleep(0.005)


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))
    return s[k]


async def metric_enqueue(a: Adapter, r: redis.Redis) -> tuple[float, str, dict]:
    n = a.args.n
    dt = await _enqueue_loop(a.enqueue, n)
    return n / dt, f"{n} jobs one by one in {dt:.2f} s", {}


async def metric_bulk(a: Adapter, r: redis.Redis) -> tuple[float, str, dict]:
    if not a.has_bulk:
        raise Unavailable(a.bulk_note)
    n = a.args.n
    t0 = time.perf_counter()
    done = 0
    while done < n:
        k = min(BULK_CHUNK, n - done)
        await _call(a.enqueue_bulk, k)
        done += k
    dt = time.perf_counter() - t0
    return n / dt, f"{n} jobs in calls of {BULK_CHUNK} in {dt:.2f} s", {}


async def metric_process(a: Adapter, r: redis.Redis) -> tuple[float, str, dict]:
    n = a.args.n
    r.delete(DONE_KEY)
    await _enqueue_loop(a.enqueue, n)
    w = Workers(a.worker_cmds(), a.url)
    try:
        first: list = []
        t0 = time.perf_counter()
        w.start()
        t_end = await _wait_done(r, n, w, first, t0)
    finally:
        await asyncio.get_running_loop().run_in_executor(None, w.stop)
        w.cleanup()
    dt = t_end - t0
    t_first, n_first = first[0] if first else (t_end, n)
    steady = (n - n_first) / (t_end - t_first) if t_end > t_first and n > n_first else None
    extra = {"startup_s": round(t_first - t0, 3)}
    if steady:
        extra["steady_per_s"] = round(steady, 1)
    note = f"{n} jobs in {dt:.2f} s from worker start (first job done after {t_first - t0:.2f} s)"
    return n / dt, note, extra


async def metric_latency(a: Adapter, r: redis.Redis) -> tuple[float, str, dict]:
    jobs = a.args.latency_jobs
    gap = a.args.latency_gap_ms / 1000.0
    r.delete(DONE_KEY, LAT_KEY)
    w = Workers(a.worker_cmds(), a.url)
    try:
        w.start()
        # warm up: workers running and past their first job, then idle for a while
        warm = 20
        for i in range(warm):
            await _call(a.enqueue, i)
        await _wait_done(r, warm, w)
        await asyncio.sleep(3.0)
        r.delete(DONE_KEY, LAT_KEY)
        sent: dict[int, float] = {}
        base = time.perf_counter()
        for i in range(jobs):
            delay = base + i * gap - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent[i] = time.time()
            await _call(a.enqueue_stamp, i)
        while r.hlen(LAT_KEY) < jobs:
            if w.all_exited():
                raise WorkersDied(f"all worker processes exited: {w.log_tail()}")
            if time.perf_counter() > _BUDGET_END[0]:
                raise BenchTimeout(
                    f"timed out waiting for latency jobs ({r.hlen(LAT_KEY)}/{jobs} started)"
                )
            await asyncio.sleep(0.01)
    finally:
        await asyncio.get_running_loop().run_in_executor(None, w.stop)
        w.cleanup()
    started = {int(k): float(v) for k, v in r.hgetall(LAT_KEY).items()}
    lat = [(started[i] - sent[i]) * 1000.0 for i in range(jobs)]
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    note = f"{jobs} jobs {a.args.latency_gap_ms:g} ms apart to idle workers; max {max(lat):.1f} ms"
    return p50, note, {"p99": round(p99, 3)}


PROCS = {
    "enqueue": metric_enqueue,
    "bulk": metric_bulk,
    "process": metric_process,
    "latency": metric_latency,
}


# --- entry point ---------------------------------------------------------------------------------


def _on_alarm(signum, frame):
    raise BenchTimeout("timed out")


def _on_term(signum, frame):
    raise BenchTimeout("stopped by SIGTERM")


async def _run(a: Adapter, metric: str, r: redis.Redis):
    await _call(a.connect)
    try:
        return await PROCS[metric](a, r)
    finally:
        try:
            await _call(a.close)
        except Exception:
            pass


def main(adapter_cls: type[Adapter], argv=None, extra_args=None) -> int:
    args = parse_args(argv, extra_args)
    os.environ["BENCH_REDIS_URL"] = args.redis_url
    metric = args.metric
    unit = UNITS[metric]
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGTERM, _on_term)  # run.py's stop: same clean-up path as a timeout
    signal.alarm(max(1, int(args.timeout)))
    _BUDGET_END[0] = time.perf_counter() + max(1.0, args.timeout - _STOP_MARGIN)
    a = None
    try:
        a = adapter_cls(args)
        r = redis.Redis.from_url(args.redis_url, decode_responses=True)
        r.flushdb()
        value, note, extra = asyncio.run(_run(a, metric, r))
        signal.alarm(0)
        emit(a, metric, value, unit, note, **extra)
        return 0
    except Partial as exc:
        emit(a, metric, None, unit, str(exc), partial_per_s=round(exc.rate, 1))
        return 0
    except BenchTimeout as exc:
        inst = a or adapter_cls.__new__(adapter_cls)
        emit(inst, metric, None, unit, f"{exc} after {args.timeout:g} s budget")
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a null result
        signal.alarm(0)
        inst = a or adapter_cls.__new__(adapter_cls)  # the constructor itself may have failed
        kind = inst.classify(exc)
        msg = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")[:800]
        if kind == "unavailable":
            note = str(exc) if isinstance(exc, Unavailable) else f"unavailable: {msg}"
            emit(inst, metric, None, unit, note)
            return 0
        traceback.print_exc()
        emit(inst, metric, None, unit, f"error: {msg}")
        return 2
    finally:
        signal.alarm(0)
        for w in list(_LIVE):
            w.stop(grace=3.0)
            w.cleanup()
