"""Every Redis key and channel name of a queue is built here and nowhere else.

Keys derived inside the Lua library from a queue's base key are listed in the key-layout
table at the top of lua/queasy.lua.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Keys of one queue. `tag` is the hash tag shared with its fail queue."""

    prefix: str
    name: str
    tag: str

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{{self.tag}}}:{self.name}"

    @property
    def wake(self) -> str:
        return f"{self.base}:wake"

    def lease(self, client_id: str) -> str:
        """The hash of the jobs leased to client `client_id`: id -> '<token> <leased_at>'."""
        return f"{self.base}:lease:{client_id}"

    def push(self, client_id: str) -> str:
        """The channel of jobs pushed to client `client_id` (already leased to it)."""
        return f"{self.base}:push:{client_id}"

    @property
    def events(self) -> str:
        return f"{self.base}:events"

    @property
    def waiting(self) -> str:
        return f"{self.base}:waiting"

    def done(self, job_id: str) -> str:
        """The channel PUBLISHed when job `job_id` ends (Queue.result waits on it)."""
        return f"{self.base}:done:{job_id}"

    @property
    def stats(self) -> str:
        """Totals and per-minute counts of finished and failed jobs (reset by DEL)."""
        return f"{self.base}:stats"

    @property
    def failed(self) -> str:
        """The index of the kept failed records by failure time (lua/queasy.lua B:failed)."""
        return f"{self.base}:failed"

    @property
    def schedule(self) -> str:
        """The queue's schedule (lua/queasy.lua B:schedule)."""
        return f"{self.base}:schedule"

    def fail_keys(self, suffix: str) -> QueueKeys:
        return QueueKeys(self.prefix, self.name + suffix, self.tag)

    @property
    def dead_letters(self) -> str:
        """The capped list queasy_py.handlers.dead_letter records failures into."""
        return f"{self.base}:dead"

    @property
    def traces(self) -> tuple[str, ...]:
        """Keys of which any one exists while the queue has jobs, kept records, events,
        totals, leases, a schedule or dead letters (lua/queasy.lua's key layout): what
        `queasy` reads to tell a queue that exists from an unknown name."""
        b = self.base
        return tuple(
            f"{b}:{k}"
            for k in ("waiting", "blocked", "ends", "events", "stats", "expiry", "schedule")
        ) + (self.dead_letters,)


@dataclass(frozen=True, slots=True)
class RegistryKeys:
    """Keys of a key prefix that belong to no queue (never touched inside an FCALL)."""

    prefix: str

    @property
    def queues(self) -> str:
        """A set of the queue names dispatched to or listened on (Client.queues)."""
        return f"{self.prefix}:queues"

    @property
    def supervisors(self) -> str:
        """A hash: client id -> JSON of a live supervisor, written by its heartbeat."""
        return f"{self.prefix}:supervisors"


def schedule_pattern(prefix: str) -> str:
    """A SCAN pattern matching the schedule key of every queue under `prefix` (and some other
    keys: check each with schedule_queue)."""
    return f"{prefix}:{{*}}:*:schedule"


def schedule_queue(prefix: str, key: str) -> tuple[str, str] | None:
    """(queue name, hash tag) of a key matched by schedule_pattern, when it is shaped like a
    queue's schedule key (a job id may end in ':schedule' too: the caller reads the key)."""
    head = f"{prefix}:{{"
    if not key.startswith(head) or not key.endswith(":schedule"):
        return None
    tag, sep, rest = key[len(head) :].partition("}:")
    name = rest[: -len(":schedule")]
    if not sep or not tag or not name or QueueKeys(prefix, name, tag).schedule != key:
        return None
    return name, tag
