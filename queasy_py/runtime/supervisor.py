"""The supervisor: one scheduling loop that dequeues by priority and free capacity, hands
jobs to worker subprocesses, kills and replaces workers past a timeout, and acks results.

Signal handlers only count signals; the wake-up fd (signal.set_wakeup_fd) makes the loop's
select() return, and the loop does the work.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import threading
import time
import uuid
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import orjson
import redis

from .. import defaults
from ..errors import InvalidInput
from ..store.connection import new_client_id
from ..store.library import Ack as AckCode
from ..store.library import Status, fcall
from ..store.pipe import RedisPipe
from ..store.pubsub import Message, Wakeup
from . import outcomes
from .heartbeat import Heartbeat, expiry_ms
from .pool import Running, WorkerProc, kill_tree, start_worker
from .scheduler import QueueState, place, plan

if TYPE_CHECKING:
    from ..client import Client
    from ..options import ListenOptions
    from ..queue import Queue

log = logging.getLogger("queasy_py")

MEMORY_CHECK_INTERVAL = 5.0
#: seconds between two checks that every lease this client holds in Redis is known here (a
#: job pushed on a connection that broke unnoticed would otherwise stay leased forever)
RECONCILE_INTERVAL = 60.0
#: seconds to wait for the marks of queasy_unpark (every job pushed before has arrived)
UNPARK_WAIT = 5.0
#: rounds (acks and dequeues) sent to Redis whose replies have not come back yet, at most
MAX_ROUNDS = 4


class Supervisor:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.r = client.redis
        s = client.settings
        self.target_workers: int = (
            s["workers"] if s["workers"] is not None else (defaults.default_workers())
        )
        self.heartbeat_interval = float(s["heartbeat_interval"])
        self.shutdown_timeout = float(s["shutdown_timeout"])
        self.max_jobs_per_worker = int(s["max_jobs_per_worker"])
        self.max_worker_memory = int(s["max_worker_memory"])
        self.poll_interval = float(s["poll_interval"])
        self.expiry_ms = expiry_ms(self.heartbeat_interval)
        self.states: dict[str, QueueState] = {}
        self.handlers: dict[str, str] = {}
        for queue, spec in client.listeners.values():
            fail_base = None
            if spec.fail_handler is not None:
                fq = queue.fail_queue
                fail_base = fq.keys.base
                self._add_state(fq, spec.fail_spec(fq.name), None)
            self._add_state(queue, spec, fail_base)
        self.workers: list[WorkerProc] = []
        self.seq = 0
        self.acks: list[outcomes.Ack] = []
        self.signals = 0
        self.stopping = False
        self.reconcile = False
        self.next_reconcile = time.monotonic() + RECONCILE_INTERVAL
        self.marks: set[bytes] = set()  # unpark marks seen on the push channels
        self.redis_retry_at = 0.0
        self.redis_backoff = 0.1
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.selector.register(self.wake_r, selectors.EVENT_READ, ("wake", None))
        self.next_memory_check = 0.0
        self.pipe = RedisPipe(client.url)
        self.watched: dict[str, Any] = {}
        self.states_by_base = {s.base: s for s in self.states.values()}

    def _add_state(self, queue: Queue, spec: ListenOptions, fail_base: str | None) -> None:
        if queue.name in self.states:
            raise InvalidInput(f"queue {queue.name!r} is listened to twice (as a fail queue too?)")
        self.states[queue.name] = QueueState(
            queue.name, queue.keys.base, queue.keys, spec, fail_base
        )
        self.handlers[queue.name] = spec.handler

    # ------------------------------------------------------------------ plumbing

    def wake(self) -> None:
        try:
            os.write(self.wake_w, b"w")
        except BlockingIOError:
            pass  # the pipe is full: the loop is awake anyway

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals += 1

    def request_stop(self) -> None:
        """Like a signal: the first stops gracefully, a second skips the wait (thread-safe)."""
        self.signals += 1
        self.wake()

    def _install_signals(self) -> list[tuple[int, Any]]:
        if threading.current_thread() is not threading.main_thread():
            return []
        previous = [
            (sig, signal.signal(sig, self._on_signal)) for sig in (signal.SIGTERM, signal.SIGINT)
        ]
        self._old_wakeup_fd = signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        return previous

    def _restore_signals(self, previous: list[tuple[int, Any]]) -> None:
        for sig, handler in previous:
            signal.signal(sig, handler)
        if previous:
            signal.set_wakeup_fd(self._old_wakeup_fd)

    # ------------------------------------------------------------------ workers

    def _spawn(self) -> WorkerProc:
        proc = start_worker(
            self.handlers,
            {defaults.URL_ENV: self.client.url, defaults.PREFIX_ENV: self.client.prefix},
        )
        self.workers.append(proc)
        self._register(proc.pipe.fileno(), ("conn", proc))
        self._register(proc.sentinel, ("exit", proc))
        return proc

    def _register(self, fd: int, data: tuple[str, Any]) -> None:
        """Watch `fd`. A registration under the same number is stale (a live descriptor has
        one number): its socket was closed, and its kind registers its new socket anew."""
        stale = self.selector.get_map().get(fd)
        if stale is not None:
            self.selector.unregister(fd)
            if stale.data[0] in self.watched:
                self.watched[stale.data[0]] = None
        self.selector.register(fd, selectors.EVENT_READ, data)

    def _ensure_pool(self) -> None:
        if self.stopping:
            return
        live = sum(1 for w in self.workers if w.healthy and not w.retiring)
        for _ in range(self.target_workers - live):
            self._spawn()

    def _forget(self, proc: WorkerProc) -> None:
        for key in (proc.pipe.fileno(), proc.sentinel):
            try:
                self.selector.unregister(key)
            except (KeyError, ValueError, OSError):
                pass
        if proc in self.workers:
            self.workers.remove(proc)

    def _kill(self, proc: WorkerProc) -> None:
        self._forget(proc)
        proc.kill()

    def _receive(self, proc: WorkerProc) -> None:
        """Read every message the worker has sent."""
        for frame in proc.pipe.read_frames():
            self._handle_message(proc, orjson.loads(frame))
        if proc.pipe.eof:  # it closed its end: its exit is handled through the sentinel
            try:
                self.selector.unregister(proc.pipe.fileno())
            except (KeyError, ValueError, OSError):
                pass

    def _handle_message(self, proc: WorkerProc, message: Any) -> None:
        if message == "ready":
            proc.ready = True
            return
        if isinstance(message, list) and message and message[0] == "import-error":
            log.error("worker %d could not load its handlers: %s", proc.pid, message[1])
            return
        now = time.time()
        for seq, started, error in message:
            job = proc.take(seq)
            if job is None:
                continue
            state = self.states[job.queue]
            if job.pushed:  # park its slot again: a dequeue goes with the ack
                state.ready_at = 0.0
            if job.timed_out:  # a result that raced its timeout: the timeout wins
                self.acks.append(self._retry_ack(job, "timeout", proc.pid, started))
                continue
            self.acks.append(
                outcomes.on_result(
                    job, state.spec, state.base, state.fail_base, error, proc.pid, started, now
                )
            )
        if self.max_jobs_per_worker and proc.done >= self.max_jobs_per_worker and proc.healthy:
            self._retire(proc, f"ran {proc.done} jobs")

    def _retire(self, proc: WorkerProc, why: str) -> None:
        if not proc.retiring:
            log.info("recycling worker %d (%s)", proc.pid, why)
            proc.retiring = True
            self._ensure_pool()

    def _on_exit(self, proc: WorkerProc) -> None:
        """A worker process ended: its unfinished jobs are retried, a new worker replaces it."""
        self._receive(proc)
        self._forget(proc)
        code = proc.process.wait()
        if proc.jobs or not proc.retiring:
            log.error(
                "worker %d exited with code %s holding %d job(s)", proc.pid, code, len(proc.jobs)
            )
        self._requeue_held(proc, "stall", "WorkerDied")
        proc.close()
        self._ensure_pool()

    def _retry_ack(
        self,
        job: Running,
        kind: str,
        pid: int,
        started: int | str,
        error_name: str = "TimeoutError",
    ) -> outcomes.Ack:
        """Retry now, counting `kind` ('timeout', 'stall', 'release')."""
        base = self.states[job.queue].base
        return outcomes.retry(job, base, int(time.time() * 1000), kind, pid, started, error_name)

    def _requeue_held(self, proc: WorkerProc, kind: str, error_name: str) -> None:
        """Retry every job `proc` held: a timed-out one as a timeout, the others as `kind`."""
        for job in list(proc.jobs.values()):
            if job.timed_out:
                self.acks.append(self._retry_ack(job, "timeout", proc.pid, ""))
            else:
                self.acks.append(self._retry_ack(job, kind, proc.pid, "", error_name))
        proc.jobs.clear()

    def _check_timeouts(self, now: float) -> None:
        for proc in list(self.workers):
            for job in proc.jobs.values():
                if not job.timed_out and now >= job.deadline:
                    job.timed_out = True
                    log.warning(
                        "job %s of %s passed its timeout of %.3gs on worker %d",
                        job.id,
                        job.queue,
                        self.states[job.queue].spec.timeout,
                        proc.pid,
                    )
                    if proc.healthy:
                        proc.healthy = False
                        self._ensure_pool()
            if not proc.healthy and all(j.timed_out for j in proc.jobs.values()):
                log.warning("killing worker %d (only timed-out jobs left)", proc.pid)
                self._kill(proc)
                self._requeue_held(proc, "timeout", "TimeoutError")
                self._ensure_pool()

    def _check_memory(self, now: float) -> None:
        if not self.max_worker_memory or now < self.next_memory_check:
            return
        self.next_memory_check = now + MEMORY_CHECK_INTERVAL
        for proc in list(self.workers):
            rss = proc.rss()
            if proc.healthy and rss > self.max_worker_memory:
                self._retire(proc, f"RSS {rss} bytes > max_worker_memory")

    def _stop_drained(self) -> None:
        """Tell each drained retiring worker to exit; its exit is reaped through its sentinel
        (_on_exit), so the loop never blocks on it."""
        for proc in self.workers:
            if proc.retiring and not proc.jobs and not proc.stop_sent:
                proc.stop_sent = True
                try:
                    proc.pipe.send_frame(b'"stop"')
                except OSError:
                    kill_tree(proc.pid)

    # ------------------------------------------------------------------ redis round

    def _round(self) -> None:
        """Send a round without waiting: pending acks, then dequeues into free capacity.

        The units of the jobs asked for are reserved on their workers at once, so rounds can
        overlap (up to MAX_ROUNDS in flight) without ever exceeding a worker's capacity.
        """
        now = time.time()
        if now < self.redis_retry_at or len(self.pipe.inflight) >= MAX_ROUNDS:
            return
        client_id = self.client.id
        if self.reconcile:
            if self.pipe.inflight:
                return  # first let every reply in flight come back
            try:
                self._reconcile(client_id, self.acks)
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                self._redis_down(exc)
                return
        accepting = [w for w in self.workers if w.accepts]
        asks: list[tuple[QueueState, list[WorkerProc]]] = []
        if not self.stopping and accepting:
            for state, slots in plan(list(self.states.values()), [w.free for w in accepting], now):
                procs = [accepting[i] for i in slots]
                for proc in procs:
                    proc.free -= state.spec.size
                state.inflight += 1
                state.woken = float("inf")
                asks.append((state, procs))
        if not self.acks and not asks:
            return
        acks, self.acks = self.acks, []
        commands, ack_groups = self._ack_commands(client_id, acks)
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
            self._on_round(client_id, acks, ack_groups, asks, replies)

        def on_error(exc: BaseException) -> None:
            self._on_round_error(acks, asks, exc)

        try:
            self.pipe.send(commands, on_reply, on_error)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            on_error(exc)
        self._watch("redis", self.pipe.socket())

    def _watch(self, kind: str, sock: Any) -> None:
        """Keep the selector watching the socket of `kind` ('redis': the round pipe,
        'pubsub': wake-ups and pushes); it changes on a reconnect. Sockets are compared as
        objects: a new socket may reuse the number of a closed one, of either kind."""
        if sock is self.watched.get(kind):
            return
        self.watched[kind] = sock
        for key in list(self.selector.get_map().values()):
            if key.data == (kind, None):
                self.selector.unregister(key.fileobj)
        fd = -1 if sock is None else sock.fileno()
        if fd >= 0:
            self._register(fd, (kind, None))

    def _redis_down(self, exc: BaseException) -> None:
        """Log once per outage step and back off; acks are kept and a reconcile follows."""
        # a lost dequeue reply, or a server restart that lost its last writes (a finish
        # undone leaves a lease this client no longer knows of): reconcile once back
        self.reconcile = True
        if time.time() < self.redis_retry_at:
            return
        log.error("Redis unreachable: %s; retrying in %.1fs", exc, self.redis_backoff)
        self.redis_retry_at = time.time() + self.redis_backoff
        self.redis_backoff = min(self.redis_backoff * 2, 5.0)

    def _release(self, state: QueueState, procs: list[WorkerProc]) -> None:
        """Give back units reserved for jobs that did not come."""
        for proc in procs:
            if proc in self.workers:
                proc.free += state.spec.size

    def _on_round_error(
        self,
        acks: list[outcomes.Ack],
        asks: list[tuple[QueueState, list[WorkerProc]]],
        exc: BaseException,
    ) -> None:
        self.acks = acks + self.acks
        for state, procs in asks:
            state.inflight -= 1
            self._release(state, procs)
        self._redis_down(exc)

    def _on_round(
        self,
        client_id: str,
        acks: list[outcomes.Ack],
        ack_groups: list[list],
        asks: list[tuple[QueueState, list[WorkerProc]]],
        replies: list,
    ) -> None:
        self.redis_backoff = 0.1
        now = time.time()
        for ack in acks:  # a retried job is ready at its run_at: wake then, not at the next poll
            if ack.op == "retry":
                state = self.states_by_base[ack.base]
                state.ready_at = min(state.ready_at, int(ack.args[2]) / 1000.0)
        for group, codes in zip(ack_groups, replies, strict=False):
            if isinstance(codes, redis.ResponseError):
                log.error("%s of %d job(s) failed: %s", group[0].op, len(group), codes)
                continue
            for ack, code in zip(group, codes, strict=True):
                if int(code) == AckCode.STALE:
                    log.warning(
                        "stale %s of job %s (this client lost its lease; it was swept)",
                        ack.op,
                        ack.args[0],
                    )
        mono = time.monotonic()
        for (state, procs), reply in zip(asks, replies[len(ack_groups) :], strict=True):
            state.inflight -= 1
            state.last_served = mono
            if client_id != self.client.id:  # swept and started over meanwhile: not ours
                continue
            if isinstance(reply, redis.ResponseError):
                log.error("dequeue of %s failed: %s", state.name, reply)
                self._release(state, procs)
                continue
            self._take(state, procs, reply, now)

    def _ack_commands(self, client_id: str, acks: list[outcomes.Ack]) -> tuple[list, list[list]]:
        grouped: dict[tuple[str, str, str | None], list[outcomes.Ack]] = defaultdict(list)
        for ack in acks:
            grouped[(ack.op, ack.base, ack.fail_base)].append(ack)
        commands: list[tuple] = []
        groups = []
        for (op, base, fail_base), items in grouped.items():
            maxlen = self.states_by_base[base].spec.events_maxlen
            keys = [base] if fail_base is None else [base, fail_base]
            args: list[Any] = ["FCALL", f"queasy_{op}", len(keys), *keys, "", client_id, maxlen]
            for ack in items:
                args.extend(ack.args)
            commands.append(tuple(args))
            groups.append(items)
        return commands, groups

    def _take(self, state: QueueState, procs: list[WorkerProc], reply: list, now: float) -> None:
        status, next_run_at = int(reply[0]), reply[1]
        if status == Status.SWEPT:
            self._release(state, procs)
            self._swept()
            return
        jobs = [reply[i : i + 7] for i in range(2, len(reply), 7)]
        if len(jobs) < len(procs):
            state.ready_at = int(next_run_at) / 1000.0 if next_run_at else float("inf")
            # a wake-up that came while the dequeue was on its way is not in its reply
            state.ready_at = min(state.ready_at, now + self.poll_interval, state.woken)
        else:
            state.ready_at = 0.0
        spec = state.spec
        self._release(state, procs[len(jobs) :])
        by_worker: dict[WorkerProc, list[Running]] = defaultdict(list)
        deadline = time.monotonic() + spec.timeout
        for (job_id, token, data, run_at, retries, stalls, timeouts), proc in zip(
            jobs, procs, strict=False
        ):
            job = self._running(
                state, job_id, token, run_at, retries, stalls, timeouts, data, deadline
            )
            early = outcomes.on_dequeue(job, spec, state.base, state.fail_base)
            if early is not None:
                self.acks.append(early)
                self._release(state, [proc])
                continue
            if proc not in self.workers or not proc.accepts:
                # its worker went away or stopped accepting since planning: place it again
                self._release(state, [proc])
                placed = self._reserve(spec.size)
                if placed is None:
                    ack = outcomes.retry(job, state.base, int(now * 1000), "release", "", "")
                    self.acks.append(ack)
                    continue
                proc = placed
            by_worker[proc].append(job)
        for proc, batch in by_worker.items():
            try:
                proc.send(batch)
            except OSError:
                pass  # it died; its exit sentinel requeues what it held

    def _reserve(self, size: int) -> WorkerProc | None:
        """The accepting worker with the most free units that fits `size`, its units taken."""
        accepting = [w for w in self.workers if w.accepts]
        index = place([w.free for w in accepting], size)
        if index is None:
            return None
        accepting[index].free -= size
        return accepting[index]

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
    ) -> Running:
        """A checked-out job, from the fields of a dequeue reply or a push message."""
        self.seq += 1
        return Running(
            self.seq,
            state.name,
            job_id.decode(),
            token.decode(),
            data,
            int(run_at),
            int(retries),
            int(stalls),
            int(timeouts),
            state.spec.size,
            deadline,
        )

    def _pushed(self, state: QueueState, message: bytes) -> None:
        """A job dispatch leased straight to this client (or an unpark mark: no newline).
        It starts on the worker with the most free units; with no room it is returned."""
        fields = message.split(b"\n", 6)
        if len(fields) < 7:
            self.marks.add(message)
            return
        job_id, token, run_at, retries, stalls, timeouts, data = fields
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
        job.pushed = True
        early = outcomes.on_dequeue(job, state.spec, state.base, state.fail_base)
        if early is not None:
            self.acks.append(early)
            state.ready_at = 0.0  # park its slot again, with the ack
            return
        proc = None if self.stopping else self._reserve(state.spec.size)
        if proc is None:  # parked slots another queue or a lost worker took meanwhile
            self.acks.append(outcomes.retry(job, state.base, job.run_at, "return", "", ""))
            return
        try:
            proc.send([job])
        except OSError:
            pass  # it died; its exit sentinel requeues what it held

    def _unpark_all(self, client_id: str) -> None:
        """Stop jobs being pushed to this client, and take in every job pushed before: each
        queue's unpark publishes a mark after them on the push channel."""
        marks = {
            state.base: f"unpark-{uuid.uuid4().hex}".encode() for state in self.states.values()
        }
        with self.r.pipeline(transaction=False) as pipe:  # one round trip for every queue
            for base, mark in marks.items():
                fcall(pipe, "queasy_unpark", [base], ["", client_id, mark])
            replies = pipe.execute()
        pairs = zip(marks.values(), replies, strict=True)
        expected = {mark for mark, (_, receivers) in pairs if receivers}
        deadline = time.monotonic() + UNPARK_WAIT
        while expected - self.marks and self.wakeup.connected:
            left = deadline - time.monotonic()
            if left <= 0:  # never read this connection again: what it held is handed back
                log.error("the pushed jobs did not arrive in %.3gs; reconnecting", UNPARK_WAIT)
                self.wakeup.close()
                break
            self._on_messages(self.wakeup.read(timeout=left))
        self.marks.clear()

    def _reconcile(self, client_id: str, acks: list[outcomes.Ack]) -> None:
        """After a lost reply or pub/sub connection, and every RECONCILE_INTERVAL: hand back
        leases this client holds but does not know of (neither running on a worker nor
        waiting in `acks` to be acked). Pushes stop first, and those sent before arrive."""
        self._unpark_all(client_id)
        held = {j.token for w in self.workers for j in w.jobs.values()}
        held.update(ack.args[1] for ack in acks)
        now_ms = int(time.time() * 1000)
        for state in self.states.values():
            pairs = self.r.fcall_ro("queasy_leases", 1, state.base, "", client_id)
            lost = [
                (pairs[i].decode(), pairs[i + 1].decode())
                for i in range(0, len(pairs), 2)
                if pairs[i + 1].decode() not in held
            ]
            for job_id, token in lost:
                log.warning(
                    "handing back job %s of %s (its dequeue reply was lost)", job_id, state.name
                )
                args = [job_id, token, now_ms, "release", "", "", ""]
                fcall(
                    self.r,
                    "queasy_retry",
                    [state.base],
                    ["", client_id, state.spec.events_maxlen, *args],
                )
            state.ready_at = 0.0  # dequeue next round, which parks the free slots again
        self.reconcile = False

    def _swept(self) -> None:
        """This client was swept as dead (it was frozen past its expiry): start over."""
        log.error(
            "this supervisor (client %s) was swept as dead; killing its workers, "
            "dropping its jobs and starting over",
            self.client.id,
        )
        for proc in list(self.workers):
            self._kill(proc)
        self.acks.clear()
        self.client.id = new_client_id()
        self.wakeup.set_channels(self._channels())
        self.heartbeat.swept.clear()
        self.heartbeat.last_ok = time.monotonic()
        for state in self.states.values():
            state.ready_at = 0.0
        self._ensure_pool()

    def _check_alive(self) -> None:
        """After a freeze (SIGSTOP) longer than the expiry, check before acting on anything."""
        if time.monotonic() - self.heartbeat.last_ok <= self.expiry_ms / 1000.0:
            return
        try:
            ok = self.heartbeat.beat(self.r, self.client.id)
        except (redis.RedisError, OSError):
            return
        if ok:
            self.heartbeat.last_ok = time.monotonic()
        else:
            self._swept()

    # ------------------------------------------------------------------ main loop

    def _timeout(self, now_mono: float, now: float) -> float:
        wait = self.poll_interval
        for proc in self.workers:
            for job in proc.jobs.values():
                if not job.timed_out:
                    wait = min(wait, job.deadline - now_mono)
        if not self.stopping and any(w.accepts and w.free for w in self.workers):
            for state in self.states.values():  # no earlier than the Redis retry time
                wait = min(wait, max(state.ready_at, self.redis_retry_at) - now)
        if self.acks:
            wait = min(wait, max(0.0, self.redis_retry_at - now))
        return max(0.0, wait)

    def _step(self) -> None:
        now_mono, now = time.monotonic(), time.time()
        events = self.selector.select(self._timeout(now_mono, now))
        # after a freeze, learn that this client was swept before acting on what arrived
        # meanwhile (jobs pushed to it then were requeued by the sweep)
        if self.heartbeat.swept.is_set():
            self._swept()
        self._check_alive()
        for key, _ in events:
            kind, proc = key.data
            if kind == "wake":
                try:
                    while os.read(self.wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            elif kind == "pubsub":
                self._on_messages(self.wakeup.read())
            elif kind == "redis":
                self.pipe.read()
                self._watch("redis", self.pipe.socket())
            elif kind == "conn":
                self._receive(proc)
            elif kind == "exit" and proc in self.workers:
                self._on_exit(proc)
        if self.heartbeat.swept.is_set():
            self._swept()
        if self.heartbeat.failed.is_set():  # the server may have restarted and lost writes
            self.heartbeat.failed.clear()
            self.reconcile = True
        if self.wakeup.lost:  # a job pushed to this client may have been lost with it
            self.wakeup.lost = False
            self.reconcile = True
        if time.monotonic() >= self.next_reconcile:
            self.next_reconcile = time.monotonic() + RECONCILE_INTERVAL
            self.reconcile = True
        self._check_alive()
        now_mono, now = time.monotonic(), time.time()
        self.wakeup.ensure()
        self._watch("pubsub", self.wakeup.socket())
        for state in self.states.values():  # polling fallback for missed wake-ups
            state.ready_at = min(state.ready_at, now + self.poll_interval)
        self._check_timeouts(now_mono)
        self._check_memory(now_mono)
        self._stop_drained()
        self._round()

    def _on_messages(self, messages: list[Message]) -> None:
        for kind, name, data in messages:
            state = self.states[name]
            if kind == "push":
                self._pushed(state, data)
            else:
                at = int(data) / 1000.0
                state.ready_at = min(state.ready_at, at)
                state.woken = min(state.woken, at)

    def _channels(self) -> dict[str, tuple[str, str]]:
        """The wake channel of every queue, and its push channel for this client id."""
        out = {}
        for name, state in self.states.items():
            out[state.keys.wake] = ("wake", name)
            out[state.keys.push(self.client.id)] = ("push", name)
        return out

    def run(self) -> int:
        previous = self._install_signals()
        self.heartbeat = Heartbeat(
            self.client.url,
            {s.base: s.spec.events_maxlen for s in self.states.values()},
            lambda: self.client.id,
            self.heartbeat_interval,
            self.wake,
        )
        self.wakeup = Wakeup(self.client.url, self._channels())
        try:
            self._ensure_pool()
            self.heartbeat.beat(self.r, self.client.id)
            self.heartbeat.start()
            self.wakeup.ensure()
            log.info(
                "supervisor %s listening on %s with %d worker(s)",
                self.client.id,
                ", ".join(sorted(self.states)),
                self.target_workers,
            )
            while not self.signals:
                self._step()
            self._shutdown()
        finally:
            self.heartbeat.stop()
            self.wakeup.close()
            if self.heartbeat.is_alive():
                self.heartbeat.join(timeout=2)
            for proc in list(self.workers):
                self._kill(proc)
            self._restore_signals(previous)
            self.pipe.close()
            self.selector.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
        return 0

    def _shutdown(self) -> None:
        """Stop dequeuing, wait for running jobs up to shutdown_timeout, then hand back the rest."""
        self.stopping = True
        try:
            self._unpark_all(self.client.id)
        except (redis.RedisError, OSError) as exc:  # it leaves at the end, which unparks too
            log.warning("could not stop pushes before shutting down: %s", exc)
        first = self.signals
        deadline = time.monotonic() + self.shutdown_timeout
        running = sum(len(w.jobs) for w in self.workers)
        log.info(
            "shutting down: waiting up to %.3gs for %d running job(s)",
            self.shutdown_timeout,
            running,
        )
        while any(w.jobs for w in self.workers) and time.monotonic() < deadline:
            if self.signals > first:
                log.warning("second signal: not waiting for running jobs")
                break
            self._step()
        for proc in list(self.workers):
            self._kill(proc)
            for job in proc.jobs.values():
                self.acks.append(self._retry_ack(job, "release", proc.pid, "", "Shutdown"))
            proc.jobs.clear()
        self.redis_retry_at = 0.0
        deadline = time.monotonic() + 10.0
        while (self.acks or self.pipe.inflight) and time.monotonic() < deadline:
            self._round()
            self.pipe.read(block=True)
            if self.acks:
                time.sleep(max(0.0, self.redis_retry_at - time.time()))
        for state in self.states.values():
            try:
                fcall(self.r, "queasy_leave", [state.base], ["", self.client.id])
            except (redis.RedisError, OSError):
                break
        log.info("supervisor %s stopped", self.client.id)
