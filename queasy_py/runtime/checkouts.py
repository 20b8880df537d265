"""Checked-out jobs onto workers: the jobs of a round's dequeue replies and the jobs pushed to
this client on its pub/sub channels (with the wake-ups and unpark marks read there) become
`Running` jobs on the workers whose units were reserved for them.

This is the per-job half of the loop (runtime/rounds.py sends the rounds): a round's jobs are
gathered by worker across all of its queues and sent as one frame per worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..store.library import Status
from ..tracing import MAX_TRACE
from . import outcomes
from .outage import Throttled
from .pool import Running, WorkerProc
from .scheduler import QueueState
from .twins import Twins
from .workers import Workers

if TYPE_CHECKING:
    from ..store.pubsub import Message
    from .heartbeat import ServerClock

#: fields of one job in a dequeue reply (after status and next_run_at): its id, lease token
#: and record (queasy_dequeue's reply 'rec': "<run_at> <enqueued_at> <retry_count>
#: <stall_count> <timeout_count> <attempts>\t<trace>\t<data>")
JOB_FIELDS = 3
Batches = dict[WorkerProc, list[Running]]


def _digits(raw: bytes) -> bool:
    """A field of a push message as the library writes it: 1-15 decimal digits."""
    return 0 < len(raw) <= 15 and raw.isdigit()


class Checkouts:
    def __init__(
        self,
        states: Mapping[str, QueueState],
        workers: Workers,
        acks: list[outcomes.Ack],
        poll_interval: float,
        on_swept: Callable[[], None],
        clock: ServerClock,
    ) -> None:
        self.states = states
        self.workers = workers
        self.acks = acks
        self.poll_interval = poll_interval
        self.on_swept = on_swept
        self.clock = clock  # the server's clock: its times are compared with this host's
        self.stopping = False
        self.marks: set[bytes] = set()  # unpark marks seen on the push channels
        self.malformed = Throttled()
        self.seq = 0
        self.twins = Twins(workers.procs, acks)  # second leases of a job running here
        #: ready queues the last plan gave no units (Rounds.send): one known to have a job
        #: may keep a worker (scheduler.plan's reservation) that a push must not refill
        self.unserved: set[QueueState] = set()

    # ------------------------------------------------------------------ dequeue replies

    def take(
        self,
        state: QueueState,
        procs: list[WorkerProc],
        reply: list,
        now: float,
        batches: Batches,
    ) -> None:
        """The jobs of one dequeue reply, each on the worker reserved for it, added to
        `batches` (sent once per worker for the whole round: send()). ValueError (nothing
        taken, no units released) for a reply that is not the library's; a job whose fields
        do not parse is dropped alone (logged, throttled; its units released)."""
        status, next_run_at = int(reply[0]), reply[1]
        if status == Status.SWEPT:
            self.workers.release(state.spec.size, procs)
            self.on_swept()
            return
        fields = len(reply) - 2
        if fields % JOB_FIELDS:
            raise ValueError(f"{fields} fields is not a whole number of jobs")
        count = fields // JOB_FIELDS
        if count > len(procs):  # checked before any job is taken: none starts, none is lost
            raise ValueError(f"{count} jobs for {len(procs)} asked")
        for at in range(4, len(reply), JOB_FIELDS):  # each record: "<numbers>\t<trace>\t..."
            rec = reply[at]
            if not isinstance(rec, bytes) or rec.find(b"\t", rec.find(b"\t") + 1) < 0:
                # 8 values per job read 3 by 3 (library 5.0.0, which ignores ARGV[8] 'rec')
                raise ValueError("not the reply 'rec' of library 5.1.0")
        if count < len(procs):
            state.ready_at = self.clock.local(int(next_run_at)) if next_run_at else float("inf")
            # a wake-up that came while the dequeue was on its way is not in its reply
            state.ready_at = min(state.ready_at, now + self.poll_interval, state.woken)
        else:
            state.ready_at = 0.0
        spec = state.spec
        size, name = spec.size, state.name
        max_stalls, max_timeouts = spec.max_stalls, spec.max_timeouts
        self.workers.release(size, procs[count:])
        deadline = time.monotonic() + spec.timeout
        # the workers that still take jobs, of those reserved (most rounds: all of them)
        taking = {p for p in set(procs[:count]) if p.accepts and p in self.workers.procs}
        running = self.twins.running_ids() if count else set()
        stopping = self.stopping  # a reply on its way when the shutdown began: none starts
        seq = self.seq
        for i in range(count):
            at = 2 + i * JOB_FIELDS
            job_id, token, rec = reply[at], reply[at + 1], reply[at + 2]
            proc = procs[i]
            try:
                seq += 1
                # "<run_at> <enqueued_at> <retry> <stall> <timeout> <attempts>\t<trace>\t<data>"
                nums, trace, data = rec.split(b"\t", 2)
                run_at, _, retries, stalls, timeouts, _ = nums.split(b" ")
                job = Running(
                    seq,
                    name,
                    job_id.decode(),
                    token.decode(),
                    data,
                    int(run_at),  # ValueError for b'1e+20', b'x' (the library writes %d)
                    0 if retries == b"0" else int(retries),  # most counts: b"0" (no int())
                    0 if stalls == b"0" else int(stalls),
                    0 if timeouts == b"0" else int(timeouts),
                    size,
                    deadline,
                )
                if 0 < len(trace) <= MAX_TRACE:  # (library 4.3.0 replies '' for a longer one)
                    job.trace = trace.decode(errors="replace")  # as a pushed one's
            except (ValueError, TypeError, AttributeError) as exc:
                seq -= 1
                self.malformed("job record", (job_id, token, rec, exc))  # (%.200r: cut)
                self.workers.release(size, [proc])  # its lease goes back with a reconcile
                continue
            if job.stall_count >= max_stalls or job.timeout_count >= max_timeouts:
                self.acks.append(outcomes.on_dequeue(job, spec, state.base, state.fail_base))
                self.workers.release(size, [proc])
                continue
            if stopping:
                self.acks.append(outcomes.retry(job, state.base, job.run_at, "return", "", ""))
                self.workers.release(size, [proc])
                continue
            if (name, job.id) in running:
                self.twins.hold(job, state.base)  # never twice at once here
                self.workers.release(size, [proc])
                continue
            running.add((name, job.id))
            if proc not in taking:
                # its worker went away or stopped accepting since planning: place it again
                self.workers.release(size, [proc])
                placed = self.workers.reserve(size)
                if placed is None:
                    ack = outcomes.retry(job, state.base, outcomes.NOW, "release", "", "")
                    self.acks.append(ack)
                    continue
                proc = placed
            batch = batches.get(proc)
            if batch is None:
                batches[proc] = [job]
            else:
                batch.append(job)
        self.seq = seq

    def send(self, batches: Batches) -> None:
        """One frame per worker."""
        for proc, batch in batches.items():
            try:
                proc.send(batch)
            except OSError:
                pass  # it died; its exit sentinel requeues what it held

    def running(
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
        """A checked-out job from the fields of a push message; None (logged, throttled)
        when a field does not parse."""
        try:
            job = Running(
                self.seq + 1,
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

    def _behind(self, state: QueueState, now: float) -> bool:
        """Whether a queue ahead of `state` (a higher priority, or its own priority with its
        turn first) is known to have a job ready that the last plan gave no units: it may
        keep a worker for itself (scheduler.plan), which a push placed by free units alone
        would refill, starving it for as long as pushes come."""
        priority, turn = state.spec.priority, state.last_served
        return any(
            s is not state
            and (s.spec.priority, -s.last_served) >= (priority, -turn)
            and s.known_ready(now)
            for s in self.unserved
        )

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
        job = self.running(
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
        if self.twins.runs(state.name, job.id):
            self.twins.hold(job, state.base)  # never twice at once here
            state.ready_at = 0.0  # park its slot again
            return
        proc = None
        if not self.stopping and not self._behind(state, time.time()):
            proc = self.workers.reserve(state.spec.size)
        if proc is None:  # parked slots another queue or a lost worker took meanwhile, or
            # a queue ahead of it waits for units: the plan, not the push, places it
            self.acks.append(outcomes.retry(job, state.base, job.run_at, "return", "", ""))
            return
        try:
            proc.send([job])
        except OSError:
            pass  # it died; its exit sentinel requeues what it held
