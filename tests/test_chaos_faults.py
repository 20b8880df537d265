"""The chaos run's server faults on a real local cluster (tests/chaos/faults.py): no primary is
frozen while the cluster is still thawing from the last freeze.

A freeze begun then left the orchestrator's loop blocked in the next cluster check (CLUSTER
INFO on every node, the frozen one included: about 50 s of the client's timeouts and retries)
with the primary still frozen, since only that loop thaws it: the cluster chaos test spent
its chaos phase with the cluster down and did half its jobs (494-509 against its 500)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.chaos.faults import ServerFaults

#: the longest one maintain() may take: a cluster check of nodes that all answer
MAINTAIN_BOUND = 2.0


def cluster_failed(local_cluster: Any, others: list[int]) -> bool:
    """Every primary of `others` (not the frozen one: it does not answer) says the cluster
    is down (the frozen one is marked failed)."""
    return all(
        b"cluster_state:fail" in local_cluster.node(p).execute_command("CLUSTER", "INFO")
        for p in others
    )


@pytest.mark.timeout(180)
def test_no_freeze_begins_while_the_cluster_thaws(local_cluster: Any) -> None:
    primary, *others = local_cluster.primary_ports()
    pid = local_cluster.procs[local_cluster.ports.index(primary)].pid
    # each freeze lasts until this test lifts it
    faults = ServerFaults(local_cluster.url, pid, lambda low, high: 600.0, ("redis_freeze",))
    try:
        faults.start("redis_freeze", time.time())
        deadline = time.monotonic() + 30.0
        while not cluster_failed(local_cluster, others):  # past the node timeout
            assert time.monotonic() < deadline, "the frozen primary was never marked failed"
            time.sleep(0.1)
        faults.lift()  # SIGCONT: the cluster is not ok again for a few seconds
        assert faults.thawing
        faults.plan = [time.time()]  # the next planned freeze is due now
        began = None
        deadline = time.monotonic() + 60.0
        while began is None:
            assert time.monotonic() < deadline, "the due freeze never began"
            before = time.monotonic()
            faults.maintain(time.time(), settled=True)
            took = time.monotonic() - before
            assert took < MAINTAIN_BOUND, f"maintain() blocked {took:.1f}s"
            if faults.active is not None:
                assert not faults.thawing, "a primary frozen while the cluster thaws"
                began = faults.began
            time.sleep(0.05)
        # it began once the cluster was ok again, after the window of the first freeze
        assert faults.windows and faults.windows[-1][1] <= began
    finally:
        faults.end()  # thawed, and the cluster ok again for the tests after this one
        faults.close()
