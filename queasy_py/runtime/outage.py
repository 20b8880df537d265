"""Redis outages as the scheduling loop sees them: which errors are "not now" (sent again
after a backoff, never dropped), one log line per kind of outage (a cluster's redirections:
a WARNING once in a while), and malformed messages or records logged once in a while and
dropped."""

from __future__ import annotations

import logging
import time

import redis

log = logging.getLogger("queasy_py")

#: the longest wait between two tries while Redis is unreachable or refuses (seconds)
MAX_BACKOFF = 5.0
#: error replies that mean "not now" (a failover, a restart, memory, a busy script, a
#: flushed library): the command is sent again after a backoff, never dropped. redis-py turns
#: some codes into classes (and strips the code from the text), the others keep their code.
TRANSIENT_CLASSES = (
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.NoScriptError,
    redis.exceptions.TryAgainError,  # also the library's migration guard (a slot moving)
    redis.exceptions.ClusterDownError,
    redis.exceptions.AskError,  # and MOVED: a cluster's slot moved (store/clusterpipe.py)
    redis.exceptions.MasterDownError,
)
TRANSIENT_CODES = ("BUSY", "MISCONF", "NOREPLICAS", "LOADING", "READONLY", "OOM", "MASTERDOWN")
#: replies of a cluster whose slot moves or just moved (MOVED, ASK, the migration guard's
#: TRYAGAIN): expected and followed (the slot map read again, the call sent again after a
#: backoff), so a WARNING once per REDIRECT_LOG_INTERVAL, not an outage's ERROR; so is
#: redis-py's "TTL exhausted" (a ClusterError: it followed them and gave up). A part lost
#: with its node's connection (clusterpipe.NodeLost, a TRYAGAIN too) is an outage.
REDIRECTS = (redis.exceptions.AskError, redis.exceptions.TryAgainError)  # MOVED is an ASK
#: seconds between two log lines about redirections
REDIRECT_LOG_INTERVAL = 60.0


#: seconds between two log lines about malformed messages or records of one kind
MALFORMED_LOG_INTERVAL = 60.0


class Throttled:
    """Logs a malformed message or record once per MALFORMED_LOG_INTERVAL per kind (a
    hostile publisher must not flood the log), and drops it."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}

    def __call__(self, kind: str, what: object) -> None:
        now = time.monotonic()
        if now - self.last.get(kind, -MALFORMED_LOG_INTERVAL) >= MALFORMED_LOG_INTERVAL:
            self.last[kind] = now
            log.error("dropped a malformed %s: %.200r (more are dropped silently)", kind, what)


def redirected(exc: BaseException) -> bool:
    """Whether `exc` says a cluster's slot moves or moved (not that a node is lost)."""
    from ..store.clusterpipe import NodeLost

    if isinstance(exc, redis.exceptions.ClusterError):  # redis-py followed them, then gave up
        return "TTL exhausted" in str(exc)
    return isinstance(exc, REDIRECTS) and not isinstance(exc, NodeLost)


class RedirectLog:
    """One WARNING line per REDIRECT_LOG_INTERVAL about a cluster's redirections (a reshard
    or a failover answers many calls with MOVED, ASK or TRYAGAIN: each is followed)."""

    def __init__(self) -> None:
        self.last = -REDIRECT_LOG_INTERVAL

    def __call__(self, who: str, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self.last >= REDIRECT_LOG_INTERVAL:
            self.last = now
            log.warning(
                "%s: Redis Cluster slot moving (%s): %s; following it (logged once per %.0fs)",
                who, type(exc).__name__, exc, REDIRECT_LOG_INTERVAL,
            )  # fmt: skip


#: the supervisor's one redirection log (its rounds and its heartbeat thread share it)
redirect_log = RedirectLog()


def _text(exc: BaseException) -> str:
    """The error's own text (a pipeline's error names its command first)."""
    return str(exc).rpartition("caused error: ")[2]


def transient(exc: BaseException) -> bool:
    """A connection error, or an error reply that a later try may not get."""
    if not isinstance(exc, redis.ResponseError) or isinstance(exc, TRANSIENT_CLASSES):
        return True
    text = _text(exc).upper()
    return text.startswith(TRANSIENT_CODES) or "FUNCTION NOT FOUND" in text


def outage_name(exc: BaseException) -> str:
    """What kind of outage `exc` is, for one log line per change (a class name such as
    OutOfMemoryError, or the error code: BUSY, MISCONF, ...)."""
    if isinstance(exc, redis.ResponseError) and not isinstance(exc, TRANSIENT_CLASSES):
        return _text(exc).split(" ", 1)[0].upper() or type(exc).__name__
    return type(exc).__name__


class Outage:
    """The backoff of the loop's Redis calls: exponential from 0.1 s, capped at MAX_BACKOFF;
    one log line when an outage starts or changes kind, one when it ends."""

    def __init__(self) -> None:
        # monotonic seconds: no round before (Redis was unreachable). Not the wall clock: a
        # clock stepped back after an outage held every round for the step's length
        self.retry_at = 0.0
        self.backoff = 0.1
        self.kind: str | None = None  # the kind of the current outage, logged once
        self.errors = 0  # failed round trips (/metrics: queasy_redis_errors_total)
        self.redirects = redirect_log

    def down(self, exc: BaseException) -> None:
        self.errors += 1
        if time.monotonic() < self.retry_at:
            return  # several calls in flight failed together: one step of backoff
        name = outage_name(exc)
        if redirected(exc):  # a slot moving: no outage begins (nor ends, during one)
            if self.kind is None:
                self.redirects("rounds", exc)
        elif name != self.kind:
            log.error("Redis unreachable or refusing (%s): %s; retrying with backoff", name, exc)
            self.kind = name
        self.retry_at = time.monotonic() + self.backoff
        self.backoff = min(self.backoff * 2, MAX_BACKOFF)

    def up(self) -> None:
        if self.kind is not None:
            log.warning("Redis answers again (after %s)", self.kind)
            self.kind = None
        self.backoff = 0.1
