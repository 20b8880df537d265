"""The Redis rounds of the scheduling loop: acks and dequeues sent without waiting (pipelined,
several in flight), their replies turned into jobs on workers; jobs pushed to this client;
the unpark marks; and the reconcile that hands back leases this client does not know of.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import redis

from ..errors import QueasyError
from ..store.library import Ack as AckCode
from ..store.library import Status, ensure_loaded
from ..tracing import MAX_TRACE
from . import outcomes
from .events import Events
from .handback import hand_back_unknown, unpark_all
from .outage import Outage, Throttled, transient
from .pool import Running, WorkerProc
from .scheduler import QueueState, plan
from .schedules import Schedules
from .workers import Workers

if TYPE_CHECKING:
    from ..client import Client
    from ..store.pipe import RedisPipe
    from ..store.pubsub import Message, Wakeup
    from .heartbeat import ServerClock
    from .metrics import Tally

log = logging.getLogger("queasy_py")

#: rounds (acks and dequeues) sent to Redis whose replies have not come back yet, at most
MAX_ROUNDS = 4
Asks = list[tuple[QueueState, list[WorkerProc]]]


def _digits(raw: bytes) -> bool:
    """A field of a push message as the library writes it: 1-15 decimal digits."""
    return 0 < len(raw) <= 15 and raw.isdigit()


class Rounds:
    def __init__(
        self,
        client: Client,
        r: redis.Redis,
        states: Mapping[str, QueueState],
        workers: Workers,
        events: Events,
        pipe: RedisPipe,
        wakeup: Wakeup,
        acks: list[outcomes.Ack],
        expiry_ms: int,
        poll_interval: float,
        on_swept: Callable[[], None],
        clock: ServerClock,
    ) -> None:
        self.client = client
        self.r = r  # the loop's own connection: every call bounded in time
        self.states = states
        self.states_by_base = {s.base: s for s in states.values()}
        specs = {s.base: s.spec for s in states.values()}
        self.headers = outcomes.ack_headers(specs, socket.gethostname())
        self.workers = workers
        self.events = events
        self.pipe = pipe
        self.wakeup = wakeup
        self.acks = acks
        self.expiry_ms = expiry_ms
        self.poll_interval = poll_interval
        self.on_swept = on_swept
        self.clock = clock  # the server's clock: its times are compared with this host's
        self.stopping = False
        self.reconcile = False
        self.marks: set[bytes] = set()  # unpark marks seen on the push channels
        self.outage = Outage()
        self.reload = False  # the library is gone (FUNCTION FLUSH, a restart): load it again
        self.unserved: set[QueueState] = set()  # ready queues the last plan gave no units
        self.malformed = Throttled()
        self.seq = 0
        self.schedules = Schedules(list(states.values()), poll_interval, clock)
        self.metrics: Tally | None = None  # counts for /metrics (runtime/metrics.py): on

    # ------------------------------------------------------------------ sending

    def send(self) -> None:
        """Send a round without waiting: pending acks, then dequeues into free capacity.

        The units of the jobs asked for are reserved on their workers at once, so rounds can
        overlap (up to MAX_ROUNDS in flight) without ever exceeding a worker's capacity.
        """
        now = time.time()
        if now < self.outage.retry_at or len(self.pipe.inflight) >= MAX_ROUNDS:
            return
        client_id = self.client.id
        if self.reload or self.reconcile:
            if self.pipe.inflight:
                return  # first let every reply in flight come back
            try:
                if self.reload:
                    version = ensure_loaded(self.r)
                    log.warning("the queasy library is gone; loading %s again", version)
                    self.reload = False
                if self.reconcile:
                    self._reconcile(client_id)
            except (redis.RedisError, OSError, QueasyError) as exc:
                self._redis_down(exc)
                return
        accepting = self.workers.accepting()
        asks: Asks = []
        if not self.stopping and accepting:
            for state, slots in plan(list(self.states.values()), [w.free for w in accepting], now):
                procs = [accepting[i] for i in slots]
                for proc in procs:
                    proc.free -= state.spec.size
                state.inflight += 1
                state.woken = float("inf")
                asks.append((state, procs))
        asked = {state for state, _ in asks}
        # ready, but no units for them now (or a reserved worker drains): a worker's result
        # or exit wakes the loop to plan again, so it does not spin on them meanwhile
        self.unserved = {s for s in self.states.values() if s.wants(now) and s not in asked}
        checks = self.schedules.take(self.acks, self.stopping)  # after the acks they follow
        if not self.acks and not asks and not checks:
            return
        acks = self.acks[:]
        self.acks.clear()
        commands, ack_groups = outcomes.ack_commands(client_id, acks, self.headers)
        commands += self.schedules.commands(checks)
        nonce = uuid.uuid4().hex[:12]
        for state, procs in asks:
            commands.append(
                (
                    "FCALL",
                    "queasy_dequeue",
                    1,
                    state.base,
                    "",
                    client_id,
                    nonce,
                    len(procs),
                    self.expiry_ms,
                    state.spec.events_maxlen,
                    1,  # park the slots left: dispatch pushes the next ready job here
                )
            )

        def on_reply(replies: list) -> None:
            n = len(ack_groups) + len(checks)
            refused = self.schedules.on_replies(checks, replies[len(ack_groups) : n])
            self._on_round(client_id, acks, ack_groups, asks, replies, refused)

        def on_error(exc: BaseException) -> None:
            self.schedules.failed(checks)
            self._on_round_error(acks, asks, exc)

        try:
            self.pipe.send(commands, on_reply, on_error)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            on_error(exc)
        self.events.watch("redis", self.pipe.socket())

    def read(self) -> None:
        """The round pipe is readable: run the callbacks of the replies that arrived."""
        self.pipe.read()
        self.events.watch("redis", self.pipe.socket())

    # ------------------------------------------------------------------ replies

    def _redis_down(self, exc: BaseException) -> None:
        """Back off (exponential, capped) and log once per kind of outage; acks are kept and a
        reconcile follows. Any Redis error is an outage here, never a crash."""
        # a lost dequeue reply, or a server restart that lost its last writes (a finish
        # undone leaves a lease this client no longer knows of): reconcile once back
        self.reconcile = True
        if "FUNCTION NOT FOUND" in str(exc).upper():
            self.reload = True
        self.outage.down(exc)

    def _on_round_error(self, acks: list[outcomes.Ack], asks: Asks, exc: BaseException) -> None:
        self.acks[:0] = acks
        for state, procs in asks:
            state.inflight -= 1
            self.workers.release(state.spec.size, procs)
        self._redis_down(exc)

    def _on_round(
        self,
        client_id: str,
        acks: list[outcomes.Ack],
        ack_groups: list[list],
        asks: Asks,
        replies: list,  # the acks' replies, then the schedule checks', then the dequeues'
        refused: BaseException | None,
    ) -> None:
        now = time.time()
        for ack in acks:  # a retried job is ready at its run_at: wake then, not at the next poll
            if ack.op == "retry":
                state = self.states_by_base[ack.base]
                at = outcomes.ready_at(ack.args[2], now, self.clock.local)
                state.ready_at = min(state.ready_at, at)
        for group, codes in zip(ack_groups, replies, strict=False):
            if isinstance(codes, redis.ResponseError):
                refused = self._ack_refused(group, codes) or refused
                continue
            for ack, code in zip(group, codes, strict=False):
                if code == AckCode.STALE:
                    log.warning(
                        "stale %s of job %s (this client lost its lease; it was swept)",
                        ack.op,
                        ack.args[0],
                    )
            if self.metrics is not None:
                self.metrics.acked(group, codes)
        mono = time.monotonic()
        for (state, procs), reply in zip(asks, replies[len(replies) - len(asks) :], strict=True):
            state.inflight -= 1
            state.last_served = mono
            if client_id != self.client.id:  # swept and started over meanwhile: not ours
                continue
            if isinstance(reply, redis.ResponseError):
                self.workers.release(state.spec.size, procs)
                if transient(reply):
                    refused = reply
                else:  # not an outage: this queue waits a poll, the others go on
                    state.ready_at = now + self.poll_interval
                    log.error("dequeue of %s failed: %s", state.name, reply)
                continue
            try:
                self._take(state, procs, reply, now)
            except (ValueError, TypeError, IndexError, AttributeError):
                self.malformed("dequeue reply", reply)
                self.workers.release(state.spec.size, procs)
        if refused is not None:
            self._redis_down(refused)
        else:
            self.outage.up()

    def _ack_refused(self, group: list[outcomes.Ack], exc: redis.ResponseError) -> Any:
        """An ack FCALL answered an error. Its acks are kept: a transient refusal (memory,
        READONLY, a flushed library) is an outage, returned to back off; otherwise each ack
        is sent alone from now on, and one refused alone is dropped, logged with its error
        (its lease is handed back by the next reconcile)."""
        if transient(exc):
            self.acks[:0] = group
            return exc
        if len(group) == 1 and group[0].alone:
            ack = group[0]
            log.error("%s of job %s refused by Redis, dropped: %s", ack.op, ack.args[0], exc)
            return None
        for ack in group:
            ack.alone = True
        self.acks[:0] = group
        return None

    def _take(self, state: QueueState, procs: list[WorkerProc], reply: list, now: float) -> None:
        status, next_run_at = int(reply[0]), reply[1]
        if status == Status.SWEPT:
            self.workers.release(state.spec.size, procs)
            self.on_swept()
            return
        jobs = [reply[i : i + 8] for i in range(2, len(reply), 8)]
        if len(jobs) < len(procs):
            state.ready_at = self.clock.local(int(next_run_at)) if next_run_at else float("inf")
            # a wake-up that came while the dequeue was on its way is not in its reply
            state.ready_at = min(state.ready_at, now + self.poll_interval, state.woken)
        else:
            state.ready_at = 0.0
        spec = state.spec
        self.workers.release(spec.size, procs[len(jobs) :])
        by_worker: dict[WorkerProc, list[Running]] = defaultdict(list)
        deadline = time.monotonic() + spec.timeout
        for (job_id, token, data, run_at, retries, stalls, timeouts, trace), proc in zip(
            jobs, procs, strict=False
        ):
            job = self._running(
                state, job_id, token, run_at, retries, stalls, timeouts, data, deadline
            )
            if job is None:  # its lease goes back with the next reconcile
                self.workers.release(spec.size, [proc])
                continue
            if trace:
                job.trace = trace.decode()
            early = outcomes.on_dequeue(job, spec, state.base, state.fail_base)
            if early is not None:
                self.acks.append(early)
                self.workers.release(spec.size, [proc])
                continue
            if proc not in self.workers or not proc.accepts:
                # its worker went away or stopped accepting since planning: place it again
                self.workers.release(spec.size, [proc])
                placed = self.workers.reserve(spec.size)
                if placed is None:
                    ack = outcomes.retry(job, state.base, outcomes.NOW, "release", "", "")
                    self.acks.append(ack)
                    continue
                proc = placed
            by_worker[proc].append(job)
        for proc, batch in by_worker.items():
            try:
                proc.send(batch)
            except OSError:
                pass  # it died; its exit sentinel requeues what it held

    def _running(
        self,
        state: QueueState,
        job_id: bytes,
        token: bytes,
        run_at: bytes,
        retries: bytes,
        stalls: bytes,
        timeouts: bytes,
        data: bytes,
        deadline: float,
    ) -> Running | None:
        """A checked-out job, from the fields of a dequeue reply or a push message; None
        (logged, throttled) when a field does not parse (the library writes integers, and
        reads a count written around it as 0: only a fake push gets here)."""
        try:
            job = Running(
                self.seq + 1,
                state.name,
                job_id.decode(),
                token.decode(),
                data,
                int(run_at),  # ValueError for b'1e+20', b'x' (the library writes %d)
                int(retries),
                int(stalls),
                int(timeouts),
                state.spec.size,
                deadline,
            )
        except (ValueError, TypeError, AttributeError) as exc:
            self.malformed("job record", (job_id, token, run_at, retries, stalls, timeouts, exc))
            return None
        self.seq += 1
        return job

    # ------------------------------------------------------------------ pub/sub

    def on_messages(self, messages: list[Message]) -> None:
        """Wake-ups (a job may be ready at the time they carry) and pushed jobs."""
        for kind, name, data in messages:
            state = self.states.get(name)
            if state is None:
                continue
            if kind == "push":
                self._pushed(state, data)
                continue
            if not _digits(data):
                self.malformed("wake-up", data)
                continue
            at = self.clock.local(int(data))
            state.ready_at = min(state.ready_at, at)
            state.woken = min(state.woken, at)

    def _pushed(self, state: QueueState, message: bytes) -> None:
        """A job dispatch leased straight to this client (or an unpark mark: no newline;
        something else with fewer fields is dropped, logged).
        It starts on the worker with the most free units; with no room it is returned."""
        fields = message.split(b"\n", 7)
        if len(fields) == 1:
            self.marks.add(message)
            return
        if len(fields) < 8:
            self.malformed("job record", fields[:7])  # anyone may PUBLISH
            return
        job_id, token, run_at, retries, stalls, timeouts, trace, data = fields
        if not all(_digits(f) for f in (run_at, retries, stalls, timeouts)):
            self.malformed("job record", fields[:6])  # anyone may PUBLISH: digits only
            return
        job = self._running(
            state,
            job_id,
            token,
            run_at,
            retries,
            stalls,
            timeouts,
            data,
            time.monotonic() + state.spec.timeout,
        )
        if job is None:  # a real push's lease goes back with the next reconcile
            return
        job.pushed = True
        if 0 < len(trace) <= MAX_TRACE:  # anyone may PUBLISH: a trace of its length only
            job.trace = trace.decode(errors="replace")
        early = outcomes.on_dequeue(job, state.spec, state.base, state.fail_base)
        if early is not None:
            self.acks.append(early)
            state.ready_at = 0.0  # park its slot again, with the ack
            return
        proc = None if self.stopping else self.workers.reserve(state.spec.size)
        if proc is None:  # parked slots another queue or a lost worker took meanwhile
            self.acks.append(outcomes.retry(job, state.base, job.run_at, "return", "", ""))
            return
        try:
            proc.send([job])
        except OSError:
            pass  # it died; its exit sentinel requeues what it held

    def unpark_all(self, client_id: str) -> None:
        """Stop pushes to this client and take in every job pushed before (runtime/handback)."""
        unpark_all(self.r, self.states, client_id, self.wakeup, self.marks, self.on_messages)

    def _reconcile(self, client_id: str) -> None:
        """After a lost reply or pub/sub connection, and every RECONCILE_INTERVAL: hand back
        leases this client holds but does not know of (neither running on a worker nor
        waiting in `acks` to be acked). Pushes stop first, and those sent before arrive."""
        self.unpark_all(client_id)
        held = {j.token for w in self.workers for j in w.jobs.values()}
        held.update(ack.args[1] for ack in self.acks)
        hand_back_unknown(self.r, self.states, client_id, held)
        self.reconcile = False
