"""The short form of the chaos test (tests/chaos/): supervisors SIGKILLed, workers SIGKILLed
and process groups frozen while handlers misbehave, the queue's server refusing writes
(maxmemory), losing its function library (FUNCTION FLUSH) and frozen (SIGSTOP), and a hostile
producer publishing garbage and sending refused dispatches; then a drain. Every invariant of
tests/chaos/invariants.py must hold. The long form: python -m tests.chaos.

The queues live on a server of this test's own (CONFIG allowed, for the faults); the handlers'
records on the session's server, so they are kept whatever the queue's server goes through."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from queasy_py.store.embedded import EmbeddedServer
from tests.chaos.run import run_chaos

SECONDS = 45.0  # of chaos; with the start and the drain the test takes about a minute
CLUSTER_SECONDS = 15.0  # on the local cluster (tests/cluster_servers.py)
#: what each run must cover (work jobs dispatched, kills, server faults, hostile actions:
#: Chaos.progress's names): the chaos phase goes on past its seconds until it did, up to its
#: hard deadline (a loaded machine, a cluster down for a while: the same coverage takes
#: longer); a run short of one at the deadline fails the test
HOSTILE = {f"hostile_{k}": 10 for k in ("wake", "push", "fcall_refused", "api_refused")}
COVERAGE = {
    "jobs": 2000,
    "kills": 10,
    "oom": 1,
    "flushes": 1,
    "redis_freezes": 1,
    **HOSTILE,
    "hostile_schedule_refused": 5,
}
CLUSTER_COVERAGE = {
    "jobs": 500,
    "kills": 3,
    "redis_freezes": 1,
    "hostile_wake": 3,  # garbage on the sharded channels, on every primary
    "hostile_push": 3,
}
MAX_SECONDS = 2 * SECONDS
CLUSTER_MAX_SECONDS = 3 * CLUSTER_SECONDS
SEED = 4
#: seconds into the chaos phase at which a server fault is made due (each kind once, in
#: turn), besides those the disruption choice makes
PLANNED_FAULTS = (3.0, 9.0, 15.0)
#: seconds into the cluster's chaos phase at which a primary's freeze is made due (it begins
#: once no supervisor is starting: a late one may not fit in the phase)
CLUSTER_FREEZES = (2.0, 7.0)


@pytest.fixture
def queue_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(admin_commands=True).start()  # CONFIG SET maxmemory
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.timeout(300)
def test_chaos_short(
    queue_server: EmbeddedServer, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    summary = run_chaos(
        queue_server.url,
        prefix,
        seconds=SECONDS,
        processes=3,
        seed=SEED,
        workdir=tmp_path,
        rate=28.0,
        drain_timeout=20.0,
        records_url=redis_url,
        server_pid=queue_server.pid,
        planned_faults=PLANNED_FAULTS,
        coverage=COVERAGE,
        max_seconds=MAX_SECONDS,
        start_during_faults=True,  # a supervisor's start may meet a fault (starts_in_fault)
    )
    no_violations(summary)
    covered(summary, COVERAGE)
    details = summary.details
    for queue in ("sched-once", "sched-skip"):  # the scheduled queues ran all along
        assert details[f"{queue}_fires"] >= 10, (queue, details)


def no_violations(summary: Any) -> None:
    """Print the run's figures (and the processes' logs when it broke an invariant), then
    assert that it broke none."""
    print(" ".join(f"{k}={v}" for k, v in summary.details.items()))
    print(summary.line)
    if summary.violations:
        for path in summary.logs:
            print(f"----- {path.name} -----")
            print(path.read_text(errors="replace")[-4000:])
    assert not summary.violations, "\n".join(summary.violations[:50])


def covered(summary: Any, coverage: dict[str, int]) -> None:
    """Assert that the run covered what `coverage` asks (it ended at its hard deadline short
    of something otherwise)."""
    figures = {"jobs": summary.jobs, "kills": summary.kills, **summary.details}
    for name, least in coverage.items():
        assert figures[name] >= least, (name, summary.line, summary.details)


@pytest.mark.timeout(300)
def test_chaos_short_on_a_cluster(
    local_cluster: Any, redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """The same load, process disruptions and hostile producer with the queues spread over
    a local cluster's 3 primaries, and one primary frozen now and then (SIGSTOP for 1-4 s;
    no replica: never failed over, the cluster is down while it is frozen past its node
    timeout; tests/test_cluster_freeze.py fails one over). The other server faults are the
    single server's."""
    primary = local_cluster.primary_ports()[0]
    summary = run_chaos(
        local_cluster.url,
        prefix,
        seconds=CLUSTER_SECONDS,
        processes=3,
        seed=SEED,
        workdir=tmp_path,
        rate=28.0,
        drain_timeout=20.0,
        records_url=redis_url,
        server_pid=local_cluster.procs[local_cluster.ports.index(primary)].pid,
        server_faults=("redis_freeze",),
        planned_faults=CLUSTER_FREEZES,
        coverage=CLUSTER_COVERAGE,
        max_seconds=CLUSTER_MAX_SECONDS,
    )
    no_violations(summary)
    covered(summary, CLUSTER_COVERAGE)
