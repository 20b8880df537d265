"""Faults of the queue's server during a chaos run (issue #19): write refusals (maxmemory 1
with noeviction), a flushed function library (FUNCTION FLUSH) and a frozen server (SIGSTOP,
then SIGCONT; on a cluster, one primary, the others serving on). One at a time; the
orchestrator lifts each one from its main loop.

The server must accept CONFIG (an `EmbeddedServer(admin_commands=True)`), and a freeze needs
its pid (a server this process started). What the server does not allow is left out of the
choice and said in the summary (`server_faults`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from redis.cluster import RedisCluster

from queasy_py.store.cluster import is_cluster_url
from queasy_py.store.library import ensure_loaded

from .connect import open_redis

#: weight of each fault in the disruption choice (the supervisor disruptions weigh 35/40/25);
#: a fault chosen is the kind used least so far (ties in this order), so a run with three
#: faults has one of each
WEIGHTS = {"oom": 8, "flush": 6, "redis_freeze": 6}
OOM_SECONDS = (1.0, 5.0)
FREEZE_SECONDS = (1.0, 4.0)


def missing_function(exc: Exception) -> bool:
    return isinstance(exc, redis.ResponseError) and "function not found" in str(exc).lower()


def refused_write(exc: Exception) -> bool:
    """A reply the server sends while it refuses writes (maxmemory with noeviction)."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return True  # redis-py's class for the OOM reply (its code is not in the message)
    return isinstance(exc, redis.ResponseError) and "maxmemory" in str(exc)


@dataclass
class ServerFaults:
    url: str
    pid: int | None  # the server's pid (freezes), None for a server we did not start
    uniform: Callable[[float, float], float]  # the orchestrator's seeded Random.uniform
    only: tuple[str, ...] | None = None  # the kinds allowed (None: all the server allows)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(WEIGHTS, 0))
    active: str | None = None
    due: str | None = None  # chosen, waiting to begin (the orchestrator says when)
    plan: list[float] = field(default_factory=list)  # times at which one is made due
    until: float = 0.0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WEIGHTS, 0.0))
    windows: list[tuple[float, float]] = field(default_factory=list)  # (began, lifted) each
    #: a cluster's primary thawed, the cluster not yet ok again (a node frozen past the node
    #: timeout is marked failed, and the cluster down, for a while after it answers)
    thawing: bool = False

    def __post_init__(self) -> None:
        # no retries: a call must never be sent twice without us knowing
        self.r = open_redis(self.url, socket_timeout=5.0, decode_responses=True)
        self.cluster = is_cluster_url(self.url)
        self.kinds = self._allowed()

    def _allowed(self) -> list[str]:
        kinds = ["flush"]
        try:
            self.r.config_get("maxmemory")
            kinds.append("oom")
        except redis.ResponseError:
            pass  # CONFIG disabled (a locked embedded server): no write refusals
        if self.pid is not None:
            kinds.append("redis_freeze")
        return [k for k in kinds if self.only is None or k in self.only]

    @property
    def frozen(self) -> bool:
        """The server (or one primary of the cluster) does not answer, or the cluster is
        not ok again yet after it: the orchestrator leaves it alone meanwhile."""
        return self.active == "redis_freeze" or self.thawing

    def weight(self, scale: float = 1.0) -> float:
        """The weight of "a server fault" in the disruption choice now (0 while one is on or
        due)."""
        if self.active is not None or self.due is not None or self.thawing:
            return 0.0
        return sum(WEIGHTS[k] for k in self.kinds) * scale

    def choose(self) -> str:
        """Make the kind used least so far due."""
        order = list(WEIGHTS)
        self.due = min(self.kinds, key=lambda k: (self.counts[k], order.index(k)))
        return self.due

    def start_due(self, now: float) -> None:
        assert self.due is not None and self.active is None and not self.thawing
        kind, self.due = self.due, None
        self.start(kind, now)

    def start(self, kind: str, now: float) -> None:
        uniform = self.uniform
        if kind == "oom":
            self.r.config_set("maxmemory-policy", "noeviction")
            self.r.config_set("maxmemory", 1)
            self._on(kind, now + uniform(*OOM_SECONDS))
        elif kind == "flush":
            self.r.function_flush()
            self.counts[kind] += 1  # nothing to lift: the clients load the library again
            self.windows.append((now, time.time()))
        elif kind == "redis_freeze":
            assert self.pid is not None
            os.kill(self.pid, signal.SIGSTOP)
            self._on(kind, now + uniform(*FREEZE_SECONDS))
        else:
            raise ValueError(kind)

    def _on(self, kind: str, until: float) -> None:
        self.counts[kind] += 1
        self.active, self.until = kind, until
        self.began = time.time()

    def down_windows(self, now: float) -> list[tuple[float, float]]:
        """The faults' (began, lifted) windows, the one on now (or a cluster thawing) as
        (began, now)."""
        if self.active is not None or self.thawing:
            return [*self.windows, (self.began, now)]
        return list(self.windows)

    def maintain(self, now: float, settled: bool) -> None:
        """Lift the fault whose time is up; make one due when the plan says so; begin the
        due one when `settled` (no supervisor is starting) and the last one is over, the
        cluster ok again included.

        Never one while a cluster is thawing: a primary frozen then would be asked by the
        next `_cluster_ok` (CLUSTER INFO on every node), which blocks this loop for the
        client's timeouts and retries (about 50 s) with the primary still frozen, since
        only this loop thaws it; the chaos phase went by meanwhile with the cluster down
        (its job count halved, tests/test_chaos_faults.py)."""
        if self.active is not None and now >= self.until:
            self.lift()
        if self.thawing and self._cluster_ok():
            self._thawed()
        if self.plan and now >= self.plan[0] and self.due is None and self.active is None:
            self.plan.pop(0)
            self.choose()
        if self.due is not None and self.active is None and not self.thawing and settled:
            self.start_due(now)

    def end(self) -> None:
        """No more faults: the one on is lifted, none is due or planned."""
        self.due = None
        self.plan.clear()
        self.lift()
        deadline = time.monotonic() + 60.0
        while self.thawing:
            if self._cluster_ok():
                self._thawed()
            elif time.monotonic() > deadline:
                raise RuntimeError("the cluster was not ok 60 s after its primary's thaw")
            else:
                time.sleep(0.1)

    def lift(self) -> None:
        """End the fault on now (SIGCONT first: the server must answer CONFIG SET)."""
        kind, self.active = self.active, None
        if kind is None:
            return
        if kind == "redis_freeze":
            assert self.pid is not None
            os.kill(self.pid, signal.SIGCONT)
            if self.cluster:  # the fault lasts until the cluster is ok again
                self.thawing = True
                return
        elif kind == "oom":
            self.r.config_set("maxmemory", 0)
        self.seconds[kind] += time.time() - self.began
        self.windows.append((self.began, time.time()))

    def _cluster_ok(self) -> bool:
        try:
            nodes = self.r.cluster_info(target_nodes=RedisCluster.ALL_NODES)
        except redis.RedisError:
            return False
        return all(info.get("cluster_state") == "ok" for info in nodes.values())

    def _thawed(self) -> None:
        self.thawing = False
        self.seconds["redis_freeze"] += time.time() - self.began
        self.windows.append((self.began, time.time()))

    def ensure_library(self) -> bool:
        """Load the library again after a flush (a producer's job); False while the server
        refuses writes (FUNCTION LOAD is refused too: try again later)."""
        try:
            ensure_loaded(self.r)
        except redis.ResponseError as exc:
            if refused_write(exc):
                return False
            raise
        return True

    def details(self) -> dict[str, object]:
        out: dict[str, object] = {
            "oom": self.counts["oom"],
            "oom_s": round(self.seconds["oom"], 1),
            "flushes": self.counts["flush"],
            "redis_freezes": self.counts["redis_freeze"],
            "redis_frozen_s": round(self.seconds["redis_freeze"], 1),
        }
        left_out = sorted(set(WEIGHTS) - set(self.kinds))
        if left_out:
            out["server_faults_off"] = ",".join(left_out)
        return out

    def close(self) -> None:
        try:
            self.lift()
        finally:
            self.r.close()
