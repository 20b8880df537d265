"""The Redis rounds of the scheduling loop: acks and dequeues sent without waiting (pipelined,
several in flight, every queue's calls in one write), their replies handed to the checkouts
(runtime/checkouts.py: jobs onto workers), outages and refused acks, when the loop next needs
to send (`wait`), and the reconcile that hands back leases this client does not know of.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import redis

from ..errors import QueasyError
from ..store.connection import reroute
from ..store.library import Ack as AckCode
from ..store.library import ensure_loaded
from . import outcomes
from .checkouts import Batches, Checkouts
from .events import Events
from .handback import hand_back_unknown, unpark_all
from .outage import Outage, transient
from .pool import WorkerProc
from .scheduler import QueueState, next_ready, plan
from .schedules import Schedules
from .workers import Workers

if TYPE_CHECKING:
    from ..client import Client
    from ..store.pipe import RedisPipe
    from ..store.pubsub import Wakeup
    from .heartbeat import ServerClock
    from .metrics import Tally

log = logging.getLogger("queasy_py")

#: rounds (acks and dequeues) sent to Redis whose replies have not come back yet, at most
MAX_ROUNDS = 4
STALE = int(AckCode.STALE)
Asks = list[tuple[QueueState, list[WorkerProc]]]


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
        self.checkouts = Checkouts(states, workers, acks, poll_interval, on_swept, clock)
        self.on_messages = self.checkouts.on_messages
        self.reconcile = False
        self.given_up: list[str] = []  # client ids this process gave up (swept): their leases
        self.outage = Outage()
        self.reload = False  # the library is gone (FUNCTION FLUSH, a restart): load it again
        self.older = False  # ...or the server's is older than ours (a dequeue reply not ours)
        self.unserved: set[QueueState] = set()  # ready queues the last plan gave no units
        #: queues whose dequeue fails on their own (not an outage): logged once until it works
        self.failing: set[str] = set()
        # lease tokens are <nonce>.<n>: a nonce per round, unique for this process (a random
        # part, then a count: no uuid per round)
        self.nonce_prefix = os.urandom(6).hex()
        self.rounds_sent = 0
        self.schedules = Schedules(list(states.values()), poll_interval, clock)
        self.metrics: Tally | None = None  # counts for /metrics (runtime/metrics.py): on

    @property
    def stopping(self) -> bool:
        return self.checkouts.stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self.checkouts.stopping = value

    # ------------------------------------------------------------------ sending

    def send(self) -> None:
        """Send a round without waiting: pending acks, then dequeues into free capacity.

        The units of the jobs asked for are reserved on their workers at once, so rounds can
        overlap (up to MAX_ROUNDS in flight) without ever exceeding a worker's capacity.
        """
        now = time.time()
        if time.monotonic() < self.outage.retry_at or len(self.pipe.inflight) >= MAX_ROUNDS:
            return
        client_id = self.client.id
        if self.checkouts.twins.held:  # a second lease of a running job: its first run ended?
            self.checkouts.twins.release_ended()
        if self.reload or self.reconcile:
            if self.pipe.inflight:
                return  # first let every reply in flight come back
            try:
                if self.reload:
                    version = ensure_loaded(self.r)
                    if self.older:  # (its WARNING came with the reply)
                        log.info("loaded the queasy library %s again", version)
                    else:
                        log.warning("the queasy library is gone; loading %s again", version)
                    self.reload = self.older = False
                if self.reconcile:
                    self._reconcile(client_id)
            except (redis.RedisError, OSError, QueasyError) as exc:
                self._redis_down(exc)
                return
        wanting = [s for s in self.states.values() if s.wants(now)]
        asks: Asks = []
        if wanting and not self.stopping:
            accepting = self.workers.accepting()
            free = [w.free for w in accepting]
            # plan only when a job of a wanting queue fits somewhere (most steps, a worker's
            # result or a reply, leave no room: planning them gave nothing)
            if free and max(free) >= min(s.spec.size for s in wanting):
                mono = time.monotonic()
                for state, slots in plan(wanting, free, now):
                    procs = [accepting[i] for i in slots]
                    for proc in procs:
                        proc.free -= state.spec.size
                    state.inflight += 1
                    state.last_served = mono  # its turn is taken: the others' come first
                    state.woken = float("inf")
                    asks.append((state, procs))
        asked = {state for state, _ in asks}
        # ready, but no units for them now (or a reserved worker drains): a worker's result
        # or exit wakes the loop to plan again, so it does not spin on them meanwhile
        self.unserved = self.checkouts.unserved = {s for s in wanting if s not in asked}
        checks = self.schedules.take(self.acks, self.stopping)  # after the acks they follow
        if not self.acks and not asks and not checks:
            return
        acks = self.acks[:]
        self.acks.clear()
        commands, ack_groups = outcomes.ack_commands(client_id, acks, self.headers)
        commands += self.schedules.commands(checks)
        self.rounds_sent += 1
        nonce = f"{self.nonce_prefix}{self.rounds_sent:x}"
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
                    "rec",  # per job its id, token and record (checkouts.take parses it)
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

    def wait(self, now: float, now_mono: float, room: bool) -> float:
        """Seconds until the loop may have a round to send (inf: only an event brings one):
        acks waiting, a queue's ready time (with `room`: a worker has free units), a
        schedule's check; none before Redis may be tried again after an outage. While the
        round cannot go out until a reply comes back (MAX_ROUNDS in flight, or a reload or
        reconcile waiting for them), that reply wakes the loop: it does not spin meanwhile;
        one that does not come in LOOP_REDIS_TIMEOUT is taken as lost (expire)."""
        inflight = len(self.pipe.inflight)
        if inflight >= MAX_ROUNDS or (inflight and (self.reload or self.reconcile)):
            return self.pipe.deadline() - now_mono  # then the reply is taken as lost (expire)
        backoff = self.outage.retry_at - now_mono  # > 0 while backing off after an outage
        wait = float("inf")
        if self.acks:
            wait = backoff
        if not self.stopping:
            if room:
                at = next_ready(self.states.values(), self.unserved, now)
                wait = min(wait, max(at - now, backoff))
            wait = min(wait, max(self.schedules.next_due() - now_mono, backoff))
        return min(wait, self.pipe.deadline() - now_mono)

    def expire(self, now_mono: float) -> None:
        """A round with no reply LOOP_REDIS_TIMEOUT after it was sent is lost with its
        connection (RedisPipe.expire): an outage, its acks kept and its dequeues reconciled."""
        if now_mono >= self.pipe.deadline():
            self.pipe.expire(now_mono)
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
            self.reload, self.older = True, False
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
            if STALE not in codes:  # the common case: no pass over the codes in Python
                if self.metrics is not None:
                    self.metrics.acked(group, codes)
                continue
            for ack, code in zip(group, codes, strict=False):
                if code == STALE:
                    log.warning(
                        "stale %s of job %s (this client lost its lease: it was swept, or "
                        "the server lost it)",
                        ack.op,
                        ack.args[0],
                    )
            if self.metrics is not None:
                self.metrics.acked(group, codes)
        batches: Batches = {}  # the round's jobs by worker, every queue's: one frame each
        for (state, procs), reply in zip(asks, replies[len(replies) - len(asks) :], strict=True):
            state.inflight -= 1
            if client_id != self.client.id:  # swept and started over meanwhile: not ours
                continue
            if isinstance(reply, redis.ResponseError):
                self.workers.release(state.spec.size, procs)
                if transient(reply):
                    refused = reply
                else:  # not an outage: this queue waits a poll, the others go on
                    state.ready_at = now + self.poll_interval
                    if state.name not in self.failing:  # once, not once per poll
                        self.failing.add(state.name)
                        log.error("dequeue of %s failed: %s", state.name, reply)
                continue
            if state.name in self.failing:
                self.failing.discard(state.name)
                log.warning("dequeue of %s works again", state.name)
            try:
                self.checkouts.take(state, procs, reply, now, batches)
            except (ValueError, TypeError, IndexError, AttributeError):
                self.checkouts.malformed("dequeue reply", reply)
                self.workers.release(state.spec.size, procs)
                # a library older than the bundled one loaded meanwhile (a process of an
                # earlier version reloaded its own after a flush): 5.0.0 ignores ARGV[8] and
                # replies 8 values per job. Load the bundled one again (ensure_loaded replaces
                # an older one), and hand back now the leases of the reply dropped
                if not self.reload:
                    log.warning(
                        "a dequeue reply of %s is not library 5.1.0's reply 'rec' (an older "
                        "library on the server?): loading the bundled one again",
                        state.name,
                    )
                self.reload = self.reconcile = self.older = True
        self.checkouts.send(batches)
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

    # ------------------------------------------------------------------ reconcile

    def unpark_all(self, client_id: str) -> None:
        """Stop pushes to this client and take in every job pushed before (runtime/handback)."""
        marks = self.checkouts.marks
        unpark_all(self.r, self.states, client_id, self.wakeup, marks, self.on_messages)

    def _reconcile(self, client_id: str) -> None:
        """After a lost reply or pub/sub connection, and every RECONCILE_INTERVAL: hand back
        leases this client holds but does not know of (neither running on a worker nor
        waiting in `acks` to be acked). Pushes stop first, and those sent before arrive."""
        reroute(self.r)  # a cluster's slot map read again: a failover during the outage
        self.unpark_all(client_id)
        held = {j.token for w in self.workers for j in w.jobs.values()}
        held.update(ack.args[1] for ack in self.acks)
        held.update(self.checkouts.twins.tokens())
        while self.given_up:  # a dequeue of the old id applied late (its reply lost) holds
            # jobs no worker runs until that id's expiry: they go back now, counted as a sweep
            hand_back_unknown(self.r, self.states, self.given_up[0], set(), "stall")
            self.given_up.pop(0)
        hand_back_unknown(self.r, self.states, client_id, held)
        self.reconcile = False
        self.wakeup.recheck()  # a cluster's silent primary keeps its subscriptions: regroup
