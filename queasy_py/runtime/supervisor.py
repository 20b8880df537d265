"""The supervisor: one scheduling loop that dequeues by priority and free capacity, hands
jobs to worker subprocesses, kills and replaces workers past a timeout, and acks results.

The loop (`_step`) waits on one selector (runtime/events.py), then reads what arrived:
worker results and exits (runtime/workers.py), round replies and pushed jobs
(runtime/rounds.py); then it checks liveness, timeouts and memory, and sends the next round.
Signal handlers only count signals; the wake-up fd (signal.set_wakeup_fd) makes the loop's
select() return, and the loop does the work.
"""

from __future__ import annotations

import logging
import selectors
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

import redis

from .. import defaults
from ..errors import InvalidInput
from ..store.connection import loop_client, new_client_id
from ..store.loopio import round_pipe, wakeup
from ..store.pubsub import Message
from .early import Early, queue_specs, stops_run, worker_env
from .events import Events
from .heartbeat import Heartbeat, expiry_ms
from .metrics import Tally, serve_metrics
from .outcomes import Ack
from .registry import Registry
from .rounds import Rounds
from .scheduler import QueueState
from .shutdown import Shutdown
from .workers import Workers

if TYPE_CHECKING:
    from ..client import Client
    from ..options import ListenOptions
    from ..queue import Queue

log = logging.getLogger("queasy_py")

#: seconds between two checks that every lease this client holds in Redis is known here (a
#: job pushed on a connection that broke unnoticed would otherwise stay leased forever)
RECONCILE_INTERVAL = 60.0
#: seconds between two urgent heartbeats while this client does not know whether it is alive
KICK_INTERVAL = 0.5


class Supervisor(Shutdown):
    def __init__(self, client: Client, early: Early | None = None) -> None:
        """`early`: workers run() started first (runtime/early.py), adopted here."""
        self.client = client
        s = client.settings
        self.heartbeat_interval = float(s["heartbeat_interval"])
        self.shutdown_timeout = float(s["shutdown_timeout"])
        self.poll_interval = float(s["poll_interval"])
        self.expiry_ms = expiry_ms(self.heartbeat_interval)
        self.states: dict[str, QueueState] = {}
        self.queues: dict[str, Queue] = {}
        for queue, spec, fail_base in queue_specs(client):
            self._add_state(queue, spec, fail_base)
        self.signals = 0
        self.stopping = False
        self.next_reconcile = time.monotonic() + RECONCILE_INTERVAL
        self.acks: list[Ack] = []  # decided, not yet sent (shared with workers and rounds)
        self.held: list[Message] = []  # pub/sub messages read while liveness was unknown
        self.next_kick = 0.0
        self.r = loop_client(client.url)  # the loop's own calls: each bounded in time
        self.events = Events()
        self.workers = Workers(self.events, self.states, worker_env(client), s, self.acks)
        results = [n for n, st in self.states.items() if st.spec.store_results]
        self.registry = Registry(client.prefix, list(self.states), self._snapshot, results)
        self.heartbeat = Heartbeat(
            client.url,
            {s.base: s.spec.events_maxlen for s in self.states.values()},
            lambda: self.client.id,
            self.heartbeat_interval,
            self.events.wake,
            self.registry,
        )
        self.wakeup = wakeup(client.url, self._channels())
        self.rounds = Rounds(
            client,
            self.r,
            self.states,
            self.workers,
            self.events,
            round_pipe(client.url),
            self.wakeup,
            self.acks,
            self.expiry_ms,
            self.poll_interval,
            self._swept,
            self.heartbeat.clock,
        )
        self.metrics: Any = None  # the /metrics server (runtime/prometheus.py), when on
        self.tally: Tally | None = None
        if s["metrics_port"] is not None:
            bases = {name: state.base for name, state in self.states.items()}
            self.tally = Tally(bases, self.heartbeat.clock)
            self.workers.metrics = self.rounds.metrics = self.tally
        if early is not None:  # last: a failure above leaves them to run(), which stops them
            self.workers.adopt(early)

    def _add_state(self, queue: Queue, spec: ListenOptions, fail_base: str | None) -> None:
        if queue.name in self.states:
            raise InvalidInput(f"queue {queue.name!r} is listened to twice (as a fail queue too?)")
        self.queues[queue.name] = queue
        self.states[queue.name] = QueueState(
            queue.name, queue.keys.base, queue.keys, spec, fail_base
        )

    def _snapshot(self) -> dict[str, Any]:
        """Workers, units and running jobs, for the registry (read from the heartbeat
        thread: copies only; a RuntimeError of a dict changed meanwhile skips a beat)."""
        wall, mono = time.time(), time.monotonic()
        procs = list(self.workers.procs)
        jobs = []
        for proc in procs:
            for job in list(proc.jobs.values()):
                timeout = self.states[job.queue].spec.timeout
                jobs.append(
                    {
                        "queue": job.queue,
                        "id": job.id,
                        "worker_pid": proc.pid,
                        "started_at": round(wall - (mono - job.deadline + timeout), 3),
                        "timed_out": job.timed_out,
                    }
                )
        return {
            "workers": [p.pid for p in procs],
            "units": defaults.WORKER_UNITS * sum(1 for p in procs if p.accepts),
            "free_units": sum(max(0, p.idle_units) for p in procs if p.accepts),
            "jobs": jobs,
            "stopping": self.stopping,
        }

    def _channels(self) -> dict[str, tuple[str, str]]:
        """The wake channel of every queue, and its push channel for this client id."""
        out = {}
        for name, state in self.states.items():
            out[state.keys.wake] = ("wake", name)
            out[state.keys.push(self.client.id)] = ("push", name)
        return out

    # ------------------------------------------------------------------ signals

    def wake(self) -> None:
        self.events.wake()

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals += 1

    def request_stop(self) -> None:
        """Like a signal: the first stops gracefully, a second skips the wait (thread-safe)."""
        self.signals += 1
        self.events.wake()

    def _install_signals(self) -> list[tuple[int, Any]]:
        if threading.current_thread() is not threading.main_thread():
            return []
        sigs = [sig for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) if stops_run(sig)]
        previous = [(sig, signal.signal(sig, self._on_signal)) for sig in sigs]
        self._old_wakeup_fd = signal.set_wakeup_fd(self.events.wake_w, warn_on_full_buffer=False)
        return previous

    def _restore_signals(self, previous: list[tuple[int, Any]]) -> None:
        for sig, handler in previous:
            signal.signal(sig, handler)
        if previous:
            signal.set_wakeup_fd(self._old_wakeup_fd)

    # ------------------------------------------------------------------ liveness

    def _swept(self) -> None:
        """This client was swept as dead (it was frozen past its expiry): start over."""
        log.error(
            "this supervisor (client %s) was swept as dead; killing its workers, "
            "dropping its jobs and starting over",
            self.client.id,
        )
        self.workers.replaced["swept"] += len(self.workers.procs)
        self.workers.kill_all()
        self.acks.clear()
        self.rounds.checkouts.twins.held.clear()  # leased to the old id: the sweep requeued them
        self.held.clear()  # pushed to the old id: the sweep requeued them
        self.rounds.given_up.append(self.client.id)
        self.rounds.reconcile = True  # hands back what the old id still holds
        self.client.id = new_client_id()
        self.wakeup.set_channels(self._channels())
        self.heartbeat.last_ok = time.monotonic()
        for state in self.states.values():
            state.ready_at = 0.0
        self.workers.ensure()

    def _alive(self) -> bool:
        """Whether this client knows it is alive: its last good heartbeat is younger than its
        expiry. After a freeze (SIGSTOP) or while Redis is unreachable it is not: the heartbeat
        thread is asked to beat now, and until it answers (alive, or swept) nothing is acked,
        dequeued or started, while timeouts and worker exits are still acted on. The loop
        itself never waits on Redis for this."""
        if time.monotonic() - self.heartbeat.last_ok <= self.expiry_ms / 1000.0:
            return True
        if time.monotonic() >= self.next_kick:
            self.next_kick = time.monotonic() + KICK_INTERVAL
            self.heartbeat.kick()
        return False

    def _needs_reconcile(self) -> None:
        """Hand back unknown leases after a failed heartbeat (the server may have restarted
        and lost writes), a lost pub/sub connection (a pushed job may have been lost with
        it), and every RECONCILE_INTERVAL."""
        if self.heartbeat.failed.is_set():
            self.heartbeat.failed.clear()
            self.rounds.reconcile = True
        if self.wakeup.lost:
            self.wakeup.lost = False
            self.rounds.reconcile = True
        if time.monotonic() >= self.next_reconcile:
            self.next_reconcile = time.monotonic() + RECONCILE_INTERVAL
            self.rounds.reconcile = True

    # ------------------------------------------------------------------ main loop

    def _timeout(self, now_mono: float, now: float) -> float:
        """How long select() may wait: until a job's timeout, the next round to send (acks, a
        queue's next ready time when a worker has room, a schedule's check: Rounds.wait), or
        the poll interval."""
        wait = min(self.poll_interval, self.workers.next_deadline() - now_mono)
        if not self._alive():  # the heartbeat wakes the loop when it has an answer
            return max(0.0, min(wait, self.next_kick - now_mono))
        room = False
        for w in self.workers.procs:  # once per step: a loop, not a generator into any()
            if w.free and w.accepts:
                room = True
                break
        return max(0.0, min(wait, self.rounds.wait(now, now_mono, room)))

    def _step(self) -> None:
        self.workers.watch_writes()
        events = self.events.select(self._timeout(time.monotonic(), time.time()))
        for key, mask in events:
            kind, proc = key.data
            if kind == "conn" and mask & selectors.EVENT_WRITE:
                self.workers.flush(proc)
                if not mask & selectors.EVENT_READ:
                    continue
            if kind == "wake":
                self.events.drain_wake()
            elif kind == "pubsub":
                self.held.extend(self.wakeup.read())
            elif kind == "redis":
                self.rounds.read()
            elif kind == "conn":
                self.workers.receive(proc)
            elif kind == "exit" and proc in self.workers:
                self.workers.on_exit(proc)
            elif kind == "reap":
                self.workers.reap(proc)
        # after a freeze, learn that this client was swept before acting on what arrived
        # meanwhile (jobs pushed to it then were requeued by the sweep)
        if self.heartbeat.swept.is_set():
            self.heartbeat.swept.clear()
            if self.heartbeat.swept_id == self.client.id:  # not an id already replaced
                self._swept()
        alive = self._alive()
        if alive and self.held:
            held, self.held = self.held, []
            self.rounds.on_messages(held)
        self._needs_reconcile()
        now_mono, now = time.monotonic(), time.time()
        self.wakeup.ensure()
        self.events.watch("pubsub", self.wakeup.socket())
        for state in self.states.values():  # polling fallback for missed wake-ups
            state.ready_at = min(state.ready_at, now + self.poll_interval)
        self.workers.start_held_back(now_mono)
        self.workers.check_starts(now_mono)
        self.workers.check_timeouts(now_mono)
        self.workers.check_memory(now_mono)
        self.workers.stop_drained()
        self.rounds.expire(now_mono)
        if alive:
            self.rounds.send()

    def run(self) -> int:
        previous = self._install_signals()
        try:
            if self.tally is not None:  # ConfigError when the port is taken
                self.metrics = serve_metrics(
                    self.tally,
                    self.workers,
                    {name: queue.counts for name, queue in self.queues.items()},
                    lambda: {"loop": self.rounds.outage.errors, "heartbeat": self.heartbeat.errors},
                    self.client.settings,
                )
            self.workers.ensure()
            try:
                self.heartbeat.beat_or_reload(self.r, self.client.id)
                self.heartbeat.last_ok = time.monotonic()
            except (redis.RedisError, OSError) as exc:  # an outage from the start: the
                log.error("first heartbeat failed: %s", exc)  # heartbeat thread retries
                self.heartbeat.last_ok = 0.0  # liveness unknown until it answers
            self._seed_schedules()
            self.heartbeat.start()
            self.wakeup.ensure()
            log.info(
                "supervisor %s listening on %s with %d worker(s)",
                self.client.id,
                ", ".join(sorted(self.states)),
                self.workers.target,
            )
            while not self.signals and self.workers.fatal is None:
                self._step()
            self._shutdown()
            if self.workers.fatal is not None:
                raise self.workers.fatal
        finally:
            self.heartbeat.stop()
            self.wakeup.close()
            if self.heartbeat.is_alive():
                self.heartbeat.join(timeout=2)
            self.workers.close()
            self._restore_signals(previous)
            self.rounds.pipe.close()
            self.r.close()
            self.events.close()
            if self.metrics is not None:
                self.metrics.close()
        return 0

    def _seed_schedules(self) -> None:
        if self.heartbeat.last_ok and self.rounds.schedules.checks:
            try:
                self.rounds.schedules.seed(self.r)
            except (redis.RedisError, OSError) as exc:  # the first checks learn it instead
                log.warning("could not read the schedules at start: %s", exc)
