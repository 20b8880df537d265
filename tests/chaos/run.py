"""The chaos orchestrator: load, disruptions, continuous checks, drain, final checks.

Disruptions: supervisors' groups SIGKILLed and frozen, workers SIGKILLed, and faults of the
queue's server (tests/chaos/faults.py: write refusals, FUNCTION FLUSH, SIGSTOP of the server);
a hostile producer (tests/chaos/hostile.py) acts throughout the chaos phase. The handlers'
records are on a server of their own, so they survive the queue server's faults.
"""

from __future__ import annotations

import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from queasy_py import Client, Queue
from queasy_py.job import LIVE_STATES
from queasy_py.queue_base import DISPATCH_CHUNK
from queasy_py.store import events

from .cluster import Cluster, Slot
from .connect import open_redis
from .faults import ServerFaults, missing_function, refused_write
from .handlers import PERIODIC_QUEUE, SCHEDULED, WORK_QUEUES, records_key
from .hostile import Hostile
from .invariants import PERIODIC_WINDOW, PROGRESS_WINDOW, Checker, Records
from .schedules import check_schedule, moves_in

PERIODIC_IDS = [f"periodic-{n}" for n in range(4)]
TICK = 0.1
CHECK_EVERY = 0.5
#: the longest drain, in drain timeouts (the drain goes on while the queues shrink: run())
DRAIN_CAP = 4
#: attempts are checked once they are this old, so late records (a frozen worker) are in
GRACE = 5.0
#: seconds between two actions of the hostile producer
HOSTILE_EVERY = 0.25
#: seconds a supervisor start takes to its first heartbeat, at most (no server fault begins
#: within this time of a start, unless start_during_faults)
START_SETTLE = 4.0


@dataclass
class Summary:
    jobs: int
    kills: int
    violations: list[str]
    details: dict[str, int] = field(default_factory=dict)
    logs: list[Path] = field(default_factory=list)

    @property
    def line(self) -> str:
        return f"chaos: {self.jobs} jobs, {self.kills} kills, {len(self.violations)} violations"


class Chaos:
    def __init__(
        self,
        url: str,
        prefix: str,
        seconds: float,
        processes: int,
        seed: int,
        workdir: Path,
        rate: float,
        drain_timeout: float,
        echo: bool,
        records_url: str | None = None,
        server_pid: int | None = None,
        hostile: bool = True,
        fault_weight: float = 1.0,
        start_during_faults: bool = False,
        forge_pushes: bool = False,
        planned_faults: tuple[float, ...] = (),
        server_faults: tuple[str, ...] | None = None,
        coverage: dict[str, int] | None = None,
        max_seconds: float | None = None,
    ) -> None:
        self.url, self.prefix, self.seconds = url, prefix, seconds
        self.coverage = dict(coverage or {})
        self.max_seconds = seconds if max_seconds is None else max(seconds, max_seconds)
        self.seed, self.rate, self.drain_timeout, self.echo = seed, rate, drain_timeout, echo
        self.rng = random.Random(seed)
        self.cluster = Cluster(url, prefix, workdir, seed, records_url)
        for n in range(processes):
            self.cluster.add(workers=1 + n % 2)
        self.client = Client(url, workers=0, prefix=prefix)
        # never called while the server is frozen; the timeout is a safety net only
        self.r = open_redis(url, decode_responses=True, socket_timeout=10.0)
        self.records_r = redis.Redis.from_url(records_url or url, decode_responses=True)
        self.faults = ServerFaults(url, server_pid, self.rng.uniform, server_faults)
        self.fault_weight = fault_weight
        self.planned_faults = planned_faults
        # Unless start_during_faults, supervisors start only while the server has no fault,
        # and no fault begins within START_SETTLE of a start. This test once found that a
        # supervisor whose start met a fault (its first heartbeat refused, OOM, timed out)
        # exited; run() now takes a failed first beat as an outage, and `queasy run` waits
        # for the server. With start_during_faults, `starts_in_fault` counts such starts.
        self.start_during_faults = start_during_faults
        self.last_start = 0.0
        # supervisors started while a server fault was on, or with one begun within
        # START_SETTLE after (only with start_during_faults)
        self.starts_in_fault = 0
        self.records = Records()
        self.checker = Checker(self.records, self.cluster.kills, self.cluster.freezes)
        names = (*WORK_QUEUES, PERIODIC_QUEUE, *SCHEDULED)
        self.queues = {q: self.client.queue(q) for q in names}
        self.fail_queues = {f"{q}-fail": self.client.queue(q).fail_queue for q in WORK_QUEUES}
        others = [self.client.queue(q).fail_queue for q in (PERIODIC_QUEUE, *SCHEDULED)]
        self.streams = {records_key(prefix): "0-0"}
        for q in (*self.queues.values(), *self.fail_queues.values(), *others):
            self.streams[q.keys.events] = "0-0"
        self.dispatched = 0
        self.pending: dict[str, list[dict]] = {q: [] for q in WORK_QUEUES}
        self.dispatch_refusals = {"oom": 0, "no_library": 0, "cluster_down": 0}
        self.actions = 0
        every = {**self.queues, **self.fail_queues}
        self.hostile = (
            Hostile(
                url, every, random.Random(f"{seed}:hostile"), self.checker.flag, seed, forge_pushes
            )
            if hostile
            else None
        )
        self.high_nonempty_since: float | None = None

    # ---------------------------------------------------------------- reading

    def poll(self) -> None:
        for key, last in self.streams.items():
            on = self.records_r if key == records_key(self.prefix) else self.r
            while True:
                rows = on.xrange(key, min=f"({last}", count=5000)
                if not rows:
                    break
                for entry_id, row in rows:
                    if key == records_key(self.prefix):
                        self.records.add_record(row)
                    else:
                        self.records.add_event(events.fields_of(row, events.queue_of(key)))
                    last = entry_id
                self.streams[key] = last

    def report(self) -> None:
        for message in self.checker.fresh:
            if self.echo:
                print(f"VIOLATION {message}", flush=True)
        self.checker.fresh.clear()

    def counts(self, queue: Queue) -> dict[str, int] | None:
        """A queue's jobs per live state (not the totals of ended ones); after a FUNCTION
        FLUSH the library is loaded again first (None while the server refuses to load it)."""
        try:
            counts = queue.counts()
        except redis.ResponseError as exc:
            if not missing_function(exc):
                raise
            if not self.faults.ensure_library():
                return None
            counts = queue.counts()
        return {state: counts[state] for state in LIVE_STATES}

    def check(self, now: float, begin: float) -> None:
        if self.faults.frozen:  # the events cannot be read: check once the server is back
            for message in self.cluster.check_exits():
                self.checker.flag((0, message), f"0 process: {message}")
            self.report()
            return
        self.poll()
        self.checker.check_continuous(now - GRACE)
        self.checker.check_periodic(
            PERIODIC_IDS, begin + PERIODIC_WINDOW, now - GRACE, self.faults.down_windows(now)
        )
        high = self.counts(self.queues["high"])
        waiting = 0 if high is None else high["waiting"]
        if high is None:
            pass  # not known now: the window goes on
        elif waiting == 0:
            self.high_nonempty_since = None
        else:
            if self.high_nonempty_since is None:
                self.high_nonempty_since = now
            since = max(self.high_nonempty_since, self.records.last_start.get("high", 0.0))
            if now - since > PROGRESS_WINDOW:
                self.checker.flag(
                    (6, round(since, 3)),
                    f"6 progress: high had {waiting} ready job(s) and no start for "
                    f"{now - since:.1f}s",
                )
        for message in self.cluster.check_exits():
            self.checker.flag((0, message), f"0 process: {message}")
        self.report()

    # ---------------------------------------------------------------- load

    def confirmed_jobs(self) -> int:
        """Work jobs known to be dispatched so far (the orchestrator's that the server took,
        the handlers' with their `dispatched` record read): a lower bound of the summary's
        `jobs`, which counts every intent but those never confirmed and never seen."""
        r = self.records
        return sum(1 for serial in r.confirmed if r.intents.get(serial, ("",))[0] in WORK_QUEUES)

    def progress(self) -> dict[str, int]:
        """What the run has covered so far, under the summary's names: `jobs` (confirmed,
        at most the summary's), `kills`, the server faults begun (`oom`, `flushes`,
        `redis_freezes`) and the hostile producer's counts (`hostile_<kind>`); none of it
        asks a server."""
        figures = {"jobs": self.confirmed_jobs(), "kills": len(self.cluster.kills)}
        figures.update((k, v) for k, v in self.faults.details().items() if isinstance(v, int))
        if self.hostile is not None:
            figures.update((f"hostile_{k}", v) for k, v in self.hostile.counts.items())
        return figures

    def chaos_over(self, now: float, begin: float) -> bool:
        """The chaos phase lasts `seconds`, and past them until every figure of `coverage`
        reached its minimum (a slow or loaded machine, the cluster down for a while: the
        same coverage takes longer), `max_seconds` at most: a run that ends there short of
        one fails its bound."""
        if now < begin + self.seconds:
            return False
        if now >= begin + self.max_seconds:
            return True
        figures = self.progress()
        return all(figures[name] >= least for name, least in self.coverage.items())

    def dispatch_initial(self, now: float, begin: float) -> None:
        due = int((now - begin) * self.rate) - self.dispatched
        for _ in range(max(0, due)):
            q = self.rng.choices(WORK_QUEUES, (5, 3, 2))[0]
            hops = len(WORK_QUEUES) - 1 - WORK_QUEUES.index(q)
            job_id = f"c{self.seed}-{self.dispatched}"
            self.dispatched += 1
            delay = self.rng.uniform(0.05, 1.0) if self.rng.random() < 0.2 else 0.0
            nb = time.time() + delay
            data = {"serial": job_id, "hops": hops, "nb": nb}
            self.pending[q].append({"data": data, "id": job_id, "delay": delay or None})
        self.send_pending()

    def send_pending(self) -> None:
        """Dispatch what is pending, one FCALL per queue (a refused FCALL wrote nothing, so
        it is sent again later: OOM refusals while they last, a flushed library at once after
        loading it again). Not while the server is frozen: a lost reply is never resent."""
        if self.faults.frozen:
            return
        for q, jobs in self.pending.items():
            while jobs:
                batch = jobs[:DISPATCH_CHUNK]
                try:
                    self.queues[q].dispatch_many(batch)
                except redis.ResponseError as exc:
                    if missing_function(exc):
                        self.dispatch_refusals["no_library"] += 1
                        if self.faults.ensure_library():
                            continue
                        return
                    if refused_write(exc):
                        self.dispatch_refusals["oom"] += 1
                        return
                    if isinstance(exc, redis.exceptions.ClusterDownError):
                        # a cluster whose frozen primary was marked failed (past its node
                        # timeout, and a while after the thaw): refused, nothing written
                        self.dispatch_refusals["cluster_down"] += 1
                        return
                    raise
                del jobs[: len(batch)]
                for job in batch:
                    self.records.add_dispatch(job["id"], q, job["id"])

    # ---------------------------------------------------------------- disruptions

    def healthy(self) -> list[Slot]:
        return [s for s in self.cluster.slots if s.healthy]

    def disrupt(self, now: float) -> None:
        healthy = self.healthy()
        kills = len(self.cluster.kills)
        weights = {"group": 35.0, "worker": 40.0, "freeze": 25.0}
        weights["server"] = self.faults.weight(self.fault_weight)
        choice = self.rng.choices(list(weights), list(weights.values()))[0]
        if choice == "server":
            self.faults.choose()  # begins in maintain(), once no supervisor is starting
            return
        self.actions += 1  # supervisor disruptions only (the freeze/kill balance below)
        if choice == "freeze" and kills < 0.5 * self.actions:
            choice = "worker"
        if choice in ("group", "freeze") and len(healthy) < 2:
            choice = "worker"  # always leave one supervisor running
        if choice == "worker":
            candidates = [(s, pid) for s in healthy for pid in self.cluster.workers_of(s)]
            if candidates:
                slot, pid = self.rng.choice(candidates)
                self.cluster.kill_worker(slot, pid)
            return
        slot = self.rng.choice(healthy)
        if choice == "group":
            self.cluster.kill_group(slot, restart_in=self.rng.uniform(0.3, 2.0))
        else:
            self.cluster.freeze(slot)
            long = self.rng.random() < 0.7
            slot.restart_at = None
            self.thaw_at[slot.index] = now + (
                self.rng.uniform(1.5, 3.0) if long else self.rng.uniform(0.2, 0.6)
            )

    def maintain(self, now: float) -> None:
        settled = self.start_during_faults or now - self.last_start >= START_SETTLE
        was_on = self.faults.active
        self.faults.maintain(now, settled)
        starting = now - self.last_start < START_SETTLE
        if was_on is None and self.faults.active is not None and starting:
            self.starts_in_fault += 1  # a fault begun while a supervisor was starting
        for slot in self.cluster.slots:
            due = slot.proc is None and slot.restart_at is not None and now >= slot.restart_at
            if due and (self.start_during_faults or self.faults.active is None):
                self.starts_in_fault += self.faults.active is not None
                self.cluster.start(slot)
                self.last_start = time.time()
            at = self.thaw_at.get(slot.index)
            if at is not None and now >= at:
                self.cluster.thaw(slot)
                del self.thaw_at[slot.index]

    # ---------------------------------------------------------------- phases

    def run(self) -> Summary:
        self.thaw_at: dict[int, float] = {}
        try:
            return self._run()
        finally:
            self.faults.close()  # the server answers again: the supervisors can stop
            self.cluster.stop_all()
            self.client.close()
            self.r.close()
            self.records_r.close()
            if self.hostile is not None:
                self.hostile.close()

    def _run(self) -> Summary:
        unknown = sorted(set(self.coverage) - set(self.progress()))
        if unknown:
            raise ValueError(f"coverage of figures a run does not count live: {unknown}")
        for slot in self.cluster.slots:
            self.cluster.start(slot)
        self.last_start = time.time()
        periodic = self.queues[PERIODIC_QUEUE]
        for job_id in PERIODIC_IDS:
            periodic.dispatch({"serial": f"{job_id}-0", "periodic": True}, id=job_id)
        begin = time.time()
        self.faults.plan = [begin + t for t in sorted(self.planned_faults)]
        next_action = begin + 3.0  # let the supervisors start first
        next_check = next_hostile = begin
        while not self.chaos_over(now := time.time(), begin):
            self.dispatch_initial(now, begin)
            self.maintain(now)
            if now >= next_action:
                self.disrupt(now)
                next_action = now + self.rng.uniform(1.2, 2.6)
            if self.hostile is not None and now >= next_hostile and not self.faults.frozen:
                self.hostile.act()
                next_hostile = now + HOSTILE_EVERY
            if now >= next_check:
                self.check(now, begin)
                next_check = now + CHECK_EVERY
            time.sleep(TICK)
        end_chaos = now
        # drain: no more load or disruptions; every supervisor runs until the queues are empty
        self.faults.end()
        self.send_pending()
        for slot in self.cluster.slots:
            self.cluster.thaw(slot)
            if slot.proc is None:
                self.cluster.start(slot)
        self.thaw_at.clear()
        watched = {**{q: self.queues[q] for q in WORK_QUEUES}, **self.fail_queues}
        # the drain ends when the queues are empty, or when they made no progress for
        # drain_timeout seconds (a job that stays is lost: invariant 4), at the latest after
        # DRAIN_CAP drain timeouts: a loaded machine drains a backlog of misbehaving jobs
        # (each `exit` takes a worker and its prefetched jobs with it) more slowly, and speed
        # is not what the drain checks
        started = time.time()
        deadline, fewest = started + self.drain_timeout, None
        while True:
            now = time.time()
            self.send_pending()
            self.check(now, begin)
            counts = {name: self.counts(q) or {"unread": 1} for name, q in watched.items()}
            left = sum(sum(c.values()) for c in counts.values())
            if fewest is None or left < fewest:  # progress: the bound starts again
                fewest, deadline = (
                    left,
                    min(now + self.drain_timeout, started + DRAIN_CAP * self.drain_timeout),
                )
            if not left or now > deadline:
                break
            time.sleep(CHECK_EVERY)
        schedules = {q: self.queues[q].schedule_info() for q in SCHEDULED}  # before the poll
        time.sleep(0.5)  # the last records of the last handlers
        now = time.time()
        self.poll()
        self.checker.check_all()
        self.checker.check_periodic(
            PERIODIC_IDS, begin + PERIODIC_WINDOW, now, self.faults.down_windows(now)
        )
        tally = self.checker.check_lost(counts, now - GRACE)
        moves = moves_in(self.cluster.logs())
        for q, info in schedules.items():
            faults, since = self.faults.windows, begin + PERIODIC_WINDOW
            found = check_schedule(self.checker, q, info, faults, moves.get(q, []), since, now)
            tally.update({f"{q}_{k}": v for k, v in found.items()})
        self.report()
        kills = self.cluster.kills
        details = {
            "starts": self.records.starts,
            **tally,
            "group_kills": sum(1 for k in kills if k.kind == "group"),
            "worker_kills": sum(1 for k in kills if k.kind == "worker"),
            "freezes": len(self.cluster.freezes),
            "zombie_starts": sum(
                1
                for attempts in self.records.attempts.values()
                for a in attempts
                if not a.held_lease
            ),
            "starts_in_fault": self.starts_in_fault,
            "chaos_s": round(end_chaos - begin, 1),
            "drain_s": round(now - end_chaos, 1),
            **self.faults.details(),
            "dispatch_oom": self.dispatch_refusals["oom"],
            "dispatch_no_library": self.dispatch_refusals["no_library"],
            "dispatch_cluster_down": self.dispatch_refusals["cluster_down"],
            **({f"hostile_{k}": v for k, v in self.hostile.counts.items()} if self.hostile else {}),
        }
        jobs = sum(1 for q, _ in self.records.intents.values() if q in WORK_QUEUES)
        jobs -= tally["unconfirmed"]
        return Summary(
            jobs, len(kills), list(self.checker.violations.values()), details, self.cluster.logs()
        )


def run_chaos(
    url: str,
    prefix: str,
    seconds: float = 60.0,
    processes: int = 3,
    seed: int = 1,
    workdir: Path | None = None,
    rate: float = 25.0,
    drain_timeout: float = 30.0,
    echo: bool = True,
    **faults: Any,
) -> Summary:
    """Chaos against the queue server at `url`. `faults`: records_url (the handlers' records
    server, which the faults leave alone; default `url`), server_pid (freezes of the server
    need it), hostile, fault_weight (scales the server faults' weight in the disruption
    choice), planned_faults (seconds into the chaos phase at which a server fault is made
    due, besides the random ones), server_faults (the kinds allowed: oom, flush,
    redis_freeze; default all), start_during_faults, forge_pushes, coverage and
    max_seconds (the chaos phase goes on past `seconds` until each figure of `coverage`
    reached its minimum, `max_seconds` at most; Chaos.progress names the figures). The
    server faults need CONFIG on `url` (OOM); those it does not allow are left out."""
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="queasy-chaos-"))
    args = (url, prefix, seconds, processes, seed, workdir, rate, drain_timeout, echo)
    return Chaos(*args, **faults).run()
