"""The chaos orchestrator: load, disruptions, continuous checks, drain, final checks."""

from __future__ import annotations

import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from queasy_py import Client

from .cluster import Cluster, Slot
from .handlers import PERIODIC_QUEUE, WORK_QUEUES, records_key
from .invariants import PERIODIC_WINDOW, PROGRESS_WINDOW, Checker, Records

PERIODIC_IDS = [f"periodic-{n}" for n in range(4)]
TICK = 0.1
CHECK_EVERY = 0.5
#: attempts are checked once they are this old, so late records (a frozen worker) are in
GRACE = 5.0


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
    ) -> None:
        self.url, self.prefix, self.seconds = url, prefix, seconds
        self.seed, self.rate, self.drain_timeout, self.echo = seed, rate, drain_timeout, echo
        self.rng = random.Random(seed)
        self.cluster = Cluster(url, prefix, workdir, seed)
        for n in range(processes):
            self.cluster.add(workers=1 + n % 2)
        self.client = Client(url, workers=0, prefix=prefix)
        self.r = redis.Redis.from_url(url, decode_responses=True)
        self.records = Records()
        self.checker = Checker(self.records, self.cluster.kills, self.cluster.freezes)
        self.queues = {q: self.client.queue(q) for q in (*WORK_QUEUES, PERIODIC_QUEUE)}
        self.fail_queues = {f"{q}-fail": self.client.queue(q).fail_queue for q in WORK_QUEUES}
        periodic_fail = self.client.queue(PERIODIC_QUEUE).fail_queue
        self.streams = {records_key(prefix): "0-0"}
        for q in (*self.queues.values(), *self.fail_queues.values(), periodic_fail):
            self.streams[q.keys.events] = "0-0"
        self.dispatched = 0
        self.actions = 0
        self.high_nonempty_since: float | None = None

    # ---------------------------------------------------------------- reading

    def poll(self) -> None:
        for key, last in self.streams.items():
            while True:
                rows = self.r.xrange(key, min=f"({last}", count=5000)
                if not rows:
                    break
                for entry_id, row in rows:
                    if key == records_key(self.prefix):
                        self.records.add_record(row)
                    else:
                        self.records.add_event(row)
                    last = entry_id
                self.streams[key] = last

    def report(self) -> None:
        for message in self.checker.fresh:
            if self.echo:
                print(f"VIOLATION {message}", flush=True)
        self.checker.fresh.clear()

    def check(self, now: float, begin: float) -> None:
        self.poll()
        self.checker.check_continuous(now - GRACE)
        self.checker.check_periodic(PERIODIC_IDS, begin + PERIODIC_WINDOW, now - GRACE)
        waiting = self.queues["high"].counts()["waiting"]
        if waiting == 0:
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

    def dispatch_initial(self, now: float, begin: float) -> None:
        due = int((now - begin) * self.rate) - self.dispatched
        if due <= 0:
            return
        batches: dict[str, list[dict]] = {q: [] for q in WORK_QUEUES}
        for _ in range(due):
            q = self.rng.choices(WORK_QUEUES, (5, 3, 2))[0]
            hops = len(WORK_QUEUES) - 1 - WORK_QUEUES.index(q)
            job_id = f"c{self.seed}-{self.dispatched}"
            self.dispatched += 1
            delay = self.rng.uniform(0.05, 1.0) if self.rng.random() < 0.2 else 0.0
            nb = time.time() + delay
            data = {"serial": job_id, "hops": hops, "nb": nb}
            batches[q].append({"data": data, "id": job_id, "delay": delay or None})
        for q, jobs in batches.items():
            if jobs:
                self.queues[q].dispatch_many(jobs)
                for job in jobs:
                    self.records.add_dispatch(job["id"], q, job["id"])

    # ---------------------------------------------------------------- disruptions

    def healthy(self) -> list[Slot]:
        return [s for s in self.cluster.slots if s.healthy]

    def disrupt(self, now: float) -> None:
        self.actions += 1
        healthy = self.healthy()
        kills = len(self.cluster.kills)
        choice = self.rng.choices(("group", "worker", "freeze"), (35, 40, 25))[0]
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
        for slot in self.cluster.slots:
            if slot.proc is None and slot.restart_at is not None and now >= slot.restart_at:
                self.cluster.start(slot)
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
            self.cluster.stop_all()
            self.client.close()
            self.r.close()

    def _run(self) -> Summary:
        for slot in self.cluster.slots:
            self.cluster.start(slot)
        periodic = self.queues[PERIODIC_QUEUE]
        for job_id in PERIODIC_IDS:
            periodic.dispatch({"serial": f"{job_id}-0", "periodic": True}, id=job_id)
        begin = time.time()
        end_chaos = begin + self.seconds
        next_action = begin + 3.0  # let the supervisors start first
        next_check = begin
        while (now := time.time()) < end_chaos:
            self.dispatch_initial(now, begin)
            self.maintain(now)
            if now >= next_action:
                self.disrupt(now)
                next_action = now + self.rng.uniform(1.2, 2.6)
            if now >= next_check:
                self.check(now, begin)
                next_check = now + CHECK_EVERY
            time.sleep(TICK)
        # drain: no more load or disruptions; every supervisor runs until the queues are empty
        for slot in self.cluster.slots:
            self.cluster.thaw(slot)
            if slot.proc is None:
                self.cluster.start(slot)
        self.thaw_at.clear()
        watched = {**{q: self.queues[q] for q in WORK_QUEUES}, **self.fail_queues}
        deadline = time.time() + self.drain_timeout
        while True:
            now = time.time()
            self.check(now, begin)
            counts = {name: q.counts() for name, q in watched.items()}
            if not any(any(c.values()) for c in counts.values()) or now > deadline:
                break
            time.sleep(CHECK_EVERY)
        time.sleep(0.5)  # the last records of the last handlers
        now = time.time()
        self.poll()
        self.checker.check_all()
        self.checker.check_periodic(PERIODIC_IDS, begin + PERIODIC_WINDOW, now)
        tally = self.checker.check_lost(counts, now - GRACE)
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
            "drain_s": round(now - end_chaos, 1),
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
) -> Summary:
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="queasy-chaos-"))
    chaos = Chaos(url, prefix, seconds, processes, seed, workdir, rate, drain_timeout, echo)
    return chaos.run()
