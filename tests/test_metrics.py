"""Prometheus /metrics of a real supervisor (issue 15): counters after known jobs, the run
and wait histograms against measured times, workers replaced and why, the gauges read from
the store, `queasy run --metrics-port` (0: a free port, logged) and a port in use."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from runtime_helpers import ACT, ROOT, Runtime, queue_spec, wait_for
from test_loop_faults import Own

from queasy_py import Client
from queasy_py.cli import config as config_file
from queasy_py.cli import exitcodes
from queasy_py.errors import ConfigError, InvalidInput

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def rt(redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(redis_url, prefix, r, tmp_path) as runtime:
        yield runtime


def metrics_port(log: Any) -> int:
    """The port a supervisor logged for /metrics (metrics_port 0: a free one)."""
    pattern = r"metrics on http://127\.0\.0\.1:(\d+)/metrics"
    return int(wait_for(lambda: re.search(pattern, log()), what="the metrics line")[1])


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def jobs(samples: Samples, queue: str) -> dict[str, float]:
    """queasy_jobs_total of `queue`, by outcome (those not zero)."""
    out = {}
    for (name, labels), n in samples.items():
        found = dict(labels)
        if name == "queasy_jobs_total" and found["queue"] == queue and n:
            out[found["outcome"]] = n
    return out


def bucket(samples: Samples, name: str, queue: str, le: str) -> float:
    return value(samples, f"{name}_bucket", queue=queue, le=le)


def test_counters_histograms_and_gauges_after_known_jobs(rt: Runtime) -> None:
    quick = {"m": queue_spec(ACT, timeout=30.0, max_retries=1, min_backoff=0.05)}
    slow = {"t": queue_spec(ACT, timeout=1.0, min_backoff=0.05, max_backoff=0.1)}
    sup = rt.start({**quick, **slow}, workers=1, metrics_port=0)
    port = metrics_port(sup.log)
    m, t = rt.queue("m"), rt.queue("t")
    for i in range(2):
        m.dispatch({"tag": "quick"}, id=f"quick{i}")
        m.dispatch({"raise": "permanent"}, id=f"perm{i}")
        m.dispatch({"raise": "retriable", "times": 1}, id=f"again{i}")  # retried, finished
    for i in range(3):
        m.dispatch({"tag": "sleep", "sleep": 0.6}, id=f"sleep{i}")
    wait_for(lambda: m.counts()["finished"] == 7 and m.counts()["failed"] == 2, 30)
    # one job spins past its timeout (its worker replaced: timeout), then one kills its
    # worker (replaced: crash, the job stalled); each runs again and finishes
    t.dispatch({"spin": True, "times": 1}, id="spin")
    wait_for(lambda: t.counts()["finished"] == 1, 30)
    t.dispatch({"exit": 3, "times": 1}, id="exit")
    wait_for(lambda: t.counts()["finished"] == 2, 30)
    m.dispatch({}, id="later", delay=3600)

    samples = wait_for(lambda: (s := scrape(port)) and jobs(s, "t").get("finished") == 2 and s)
    assert jobs(samples, "m") == {"finished": 7, "failed": 2, "retried": 2}
    assert jobs(samples, "t") == {"finished": 2, "timed_out": 1, "stalled": 1}
    assert value(samples, "queasy_workers_replaced_total", reason="timeout") == 1
    assert value(samples, "queasy_workers_replaced_total", reason="crash") == 1

    # every run that sent a result, in its queue's histograms; the sleepers' measured
    # times (>= 0.6 s, from the handlers' own records) above 0.5 s, the others below
    runs = "queasy_job_run_seconds"
    assert value(samples, f"{runs}_count", queue="m") == 11
    assert bucket(samples, runs, "m", "+Inf") == 11
    slept = [
        e["t"] - s["t"]
        for s, e in zip(
            rt.records("start", tag="sleep"), rt.records("end", tag="sleep"), strict=True
        )
    ]
    assert min(slept) >= 0.6
    assert bucket(samples, runs, "m", "0.5") == 8
    assert bucket(samples, runs, "m", "2.5") == 11
    assert sum(slept) <= value(samples, f"{runs}_sum", queue="m") <= sum(slept) + 8 * 0.5 + 1
    assert value(samples, "queasy_job_wait_seconds_count", queue="m") == 11
    assert value(samples, "queasy_job_wait_seconds_count", queue="t") == 2  # killed: no result

    assert value(samples, "queasy_queue_jobs", queue="m", state="delayed") == 1
    assert value(samples, "queasy_queue_jobs", queue="m", state="waiting") == 0
    assert value(samples, "queasy_queue_jobs", queue="t", state="active") == 0
    assert value(samples, "queasy_workers") == 1
    assert value(samples, "queasy_capacity_units") == 100
    assert value(samples, "queasy_capacity_units_free") == 100
    assert value(samples, "queasy_redis_errors_total", source="loop") == 0
    assert all("id" not in dict(labels) for _, labels in samples)  # no job ids as labels
    assert sup.stop() == 0


def queasy_run(tmp_path: Path, url: str, prefix: str, *args: str) -> subprocess.Popen:
    config = tmp_path / "queasy.toml"
    config.write_text(
        f'redis = "{url}"\nprefix = "{prefix}"\nworkers = 1\nshutdown_timeout = 5.0\n'
        f'[queues.q]\nhandler = "{ACT}"\n'
    )
    return subprocess.Popen(
        [sys.executable, "-m", "queasy_py.cli", "run", str(config), *args],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT),
            "QUEASY_TEST_URL": url,
            "QUEASY_TEST_PREFIX": prefix,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_queasy_run_metrics_port_zero_serves_a_free_port(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    proc = queasy_run(tmp_path, redis_url, prefix, "--metrics-port", "0")
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "metrics on" in line:
                break
        port = metrics_port(lambda: "".join(lines))
        with Client(redis_url, workers=0, prefix=prefix) as producer:
            producer.queue("q").dispatch({}, id="one")
            wait_for(lambda: producer.queue("q").counts()["finished"] == 1, 30)
        samples = wait_for(lambda: (s := scrape(port)) and jobs(s, "q") and s)
        assert jobs(samples, "q") == {"finished": 1}
        proc.terminate()
        assert proc.wait(timeout=20) == exitcodes.OK
    finally:
        proc.kill()
        proc.communicate()


def test_port_in_use_is_one_clear_line_at_start(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = queasy_run(tmp_path, redis_url, prefix, "--metrics-port", str(port))
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == exitcodes.CONFIG, out
    errors = [line for line in out.splitlines() if " ERROR " in line]
    assert len(errors) == 1, out
    assert f"metrics port {port} on 127.0.0.1 is in use" in errors[0]
    assert "Traceback" not in out


def test_metrics_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"metrics_port: metrics_port must be None or a port"):
        config_file.parse({"metrics_port": "9191", "queues": {"q": {"handler": ACT}}}, "c.toml")
    parsed = config_file.parse(
        {"metrics_port": 9191, "metrics_host": "0.0.0.0", "queues": {"q": {"handler": ACT}}}, "c"
    )
    assert parsed.settings == {"metrics_port": 9191, "metrics_host": "0.0.0.0"}
    with pytest.raises(InvalidInput, match="metrics_port"):
        Client("redis://127.0.0.1:1", metrics_port=70000)
    with pytest.raises(InvalidInput, match="metrics_host"):
        Client("redis://127.0.0.1:1", metrics_host="")
    # off, nothing of prometheus_client is imported (`import queasy_py` stays light)
    code = (
        "import sys, queasy_py; c = queasy_py.Client('redis://127.0.0.1:1', metrics_port=None); "
        "print('prometheus_client' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


def test_a_frozen_server_does_not_hold_a_scrape_past_prometheus_timeout(
    prefix: str, r: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """With the queues' server SIGSTOPped, a scrape of a supervisor with three queues (one
    with a fail handler has two) still answers within Prometheus' default scrape_timeout
    (10 s, scrape()'s): each counts read waits out its timeout, so the reads stop once the
    scrape has spent its budget on them; the workers and the errors are what an operator
    needs then."""
    own = Own()
    own_r = redis.Redis.from_url(own.url, decode_responses=True)
    try:
        with Runtime(own.url, prefix, own_r, tmp_path, records=(redis_url, r)) as rt:
            sup = rt.start({f"q{i}": queue_spec(ACT) for i in range(3)}, metrics_port=0)
            port = metrics_port(sup.log)
            assert value(scrape(port), "queasy_queue_jobs", queue="q2", state="waiting") == 0
            own.freeze()
            try:
                start = time.monotonic()
                samples = scrape(port)
                took = time.monotonic() - start
            finally:
                own.thaw()
            assert took < 9.0
            assert value(samples, "queasy_workers") == 1
            assert value(samples, "queasy_redis_errors_total", source="scrape") >= 1
            after = wait_for(
                lambda: (
                    (s := scrape(port))
                    and ("queasy_queue_jobs", frozenset({("queue", "q2"), ("state", "waiting")}))
                    in s
                    and s
                )
            )  # all read again
            assert value(after, "queasy_queue_jobs", queue="q0", state="waiting") == 0
    finally:
        own_r.close()
        own.close()


def test_every_counter_series_is_there_from_the_start(rt: Runtime) -> None:
    """A counter series that first appears at 1 loses that first increase to rate() and
    increase(): each reason of queasy_workers_replaced_total is served at 0 from the start,
    as the outcomes of queasy_jobs_total are."""
    sup = rt.start({"q": queue_spec(ACT)}, workers=1, metrics_port=0)
    samples = scrape(metrics_port(sup.log))
    for reason in ("timeout", "crash", "memory", "max_jobs", "start", "swept"):
        key = ("queasy_workers_replaced_total", frozenset({("reason", reason)}))
        assert samples.get(key) == 0, reason
    for outcome in ("finished", "failed", "retried", "timed_out", "stalled", "released"):
        assert value(samples, "queasy_jobs_total", queue="q", outcome=outcome) == 0
        assert ("queasy_jobs_total", frozenset({("queue", "q"), ("outcome", outcome)})) in samples
    assert sup.stop() == 0
