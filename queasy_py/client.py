"""Client: one process's connection to Redis, its queues and (when listening) its supervisor."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import defaults, validate
from .connfailed import as_connection_failed
from .errors import InvalidInput, QueasyError
from .options import check_setting
from .queue import Queue
from .reach import Reach
from .resolve import PathLike, Target, resolve
from .store.connection import (
    check_url,
    is_cluster_url,
    mask_url,
    new_client_id,
    plain_url,
    producer_client,
    wait_reachable,
)
from .store.library import ensure_loaded

if TYPE_CHECKING:
    import redis

    from .job import ScheduleInfo
    from .options import ListenOptions
    from .runtime.supervisor import Supervisor
    from .store.calls import FastCall
    from .store.cluster import ClusterCall
    from .store.shared import SharedServer

log = logging.getLogger("queasy_py")


class Client:
    """A connection to Redis. `url` None: $QUEASY_REDIS_URL, else the `redis` of the project's
    config (`config`: a TOML file; default the [tool.queasy] of the project's pyproject.toml),
    else the project's embedded server (`data_dir`: its directory), as queasy_py/resolve.py says.

    Making one does not connect (a module-level client imports while Redis is down): the
    first call that needs Redis connects and loads the function library (ready()), as
    AsyncClient does; a bad URL is refused at once (ConfigError).

    `workers` is the number of worker subprocesses a supervisor started by run() uses
    (default os.cpu_count(); 0 makes a producer-only client). Other supervisor settings
    (see queasy_py/defaults.py SUPERVISOR) are keyword arguments.
    """

    def __init__(
        self,
        url: str | Target | None = None,
        workers: int | None = None,
        *,
        prefix: str = defaults.PREFIX,
        max_payload: int = defaults.MAX_PAYLOAD_BYTES,
        config: PathLike | None = None,
        data_dir: PathLike | None = None,
        **settings: Any,
    ) -> None:
        unknown = set(settings) - set(defaults.SUPERVISOR)
        if unknown:
            raise InvalidInput(f"unknown Client settings: {sorted(unknown)}")
        for key, value in {**settings, "workers": workers}.items():
            check_setting(key, value)
        self.prefix = validate.key_prefix(prefix)
        self.max_payload = validate.payload_limit(max_payload)
        self.settings: dict[str, Any] = {**defaults.SUPERVISOR, **settings, "workers": workers}
        target = url if isinstance(url, Target) else resolve(url, config=config, data_dir=data_dir)
        self.server: SharedServer | None = target.server
        self.url = target.url
        self.cluster = is_cluster_url(self.url)
        # a redis.Redis, or a ClusterClient; made by ready() on a cluster URL and on a plain
        # one (redis:// or unix:// without options: nothing of it can be refused later), so
        # that run() starts its workers before redis-py is imported (store/lazyredis.py)
        self._redis: Any = None
        #: how many times close() was called: a result() that saw it change ends (ClientClosed)
        self.closes = 0
        try:  # a bad URL is a ConfigError now; the connection is made by the first call
            if self.cluster:
                from .store.clusterurl import parse_cluster_url

                parse_cluster_url(self.url)
            elif plain_url(self.url):
                check_url(self.url)
            else:
                self._redis = producer_client(self.url)
        except BaseException:
            self.close()
            raise
        # INFO when the URL was found (env, config, the embedded server), not given
        log.log(logging.DEBUG if target.explicit else logging.INFO, "using %s", target.describe())
        self._fastcall: Any = None  # made by ready()
        self.library_version: str | None = None  # set by ready()
        self._connecting = threading.Lock()
        self.id = new_client_id()
        self._queues: dict[str, Queue] = {}
        self._supervisor: Supervisor | None = None
        self._running = threading.Lock()  # held by run(): one supervisor per client
        # stop() while run() starts (no supervisor yet): the supervisor stops once made
        self._stopping = threading.Lock()  # guards _supervisor and _stop_asked against stop()
        self._stop_asked = False
        self.listeners: dict[str, tuple[Queue, ListenOptions]] = {}

    @as_connection_failed
    def ready(self, attempts: int = defaults.CONNECT_ATTEMPTS) -> Client:
        """Connect and load the function library, if not done yet (the first call that needs
        Redis does it): ConnectionFailed after `attempts` tries (CONNECT_BACKOFF doubling),
        AuthenticationFailed, VersionMismatch. A failed try is tried again by the next call."""
        with self._connecting:  # threads making their first calls at once connect once
            if self.library_version is None and self.cluster:
                from .store.cluster import ClusterCall, connect_cluster

                self._redis, self.library_version = connect_cluster(self.url, attempts)
                self._fastcall = ClusterCall(self._redis)
            elif self.library_version is None:
                from .store.calls import FastCall

                if self._redis is None:
                    self._redis = producer_client(self.url)
                if self._fastcall is None:
                    self._fastcall = FastCall(self._redis)
                wait_reachable(self._redis, self.url, attempts)
                self.library_version = ensure_loaded(self._redis)
        return self

    @property
    def redis(self) -> redis.Redis:
        """The producer's redis.Redis (bytes replies), connected and with the library loaded
        (on a cluster URL: a redis-py RedisCluster, see store/cluster.py)."""
        if self.library_version is None:
            self.ready()
        return self._redis

    @property
    def fastcall(self) -> FastCall | ClusterCall:
        if self.library_version is None:
            self.ready()
        return self._fastcall

    def __repr__(self) -> str:
        return f"<Client {self.id} {mask_url(self.url)}>"

    def queue(self, name: str) -> Queue:
        """The queue called `name` (1-100 chars of A-Z a-z 0-9 _ . : -)."""
        return self._queue(name, None)

    def _queue(self, name: str, tag: str | None) -> Queue:
        queue = self._queues.get(name)
        if queue is None:
            queue = Queue(self, name, tag)
            self._queues[name] = queue
        elif tag is not None and queue.keys.tag != tag:
            raise InvalidInput(
                f"queue {name!r} is already in use with hash tag {queue.keys.tag!r}; "
                f"it cannot also be the fail queue of {tag!r}"
            )
        return queue

    @as_connection_failed
    def queues(self) -> list[str]:
        """The names of the queues that exist under this prefix: dispatched to (by a
        queasy_py client) or listened on, sorted."""
        return Reach(self, partial=False).queue_names()

    @as_connection_failed
    def supervisors(self) -> list[dict[str, Any]]:
        """The live supervisors of this prefix, as each published itself with its last
        heartbeat: id (client id), host, pid, started_at, queues, results (those of its
        queues that store results), workers (pids), units, free_units, jobs ([{queue, id,
        worker_pid, started_at, timed_out}]), stopping, beat_at and expires_at (epoch
        seconds; beat_at and expires_at on the server's clock). Sorted by host, then pid."""
        return Reach(self, partial=False).supervisors()

    @as_connection_failed
    def schedules(self) -> dict[str, ScheduleInfo]:
        """The schedule of every queue (under this client's prefix) that has one, by queue
        name: its spec, the current occurrence's fire time and state, the last outcome."""
        return Reach(self, partial=False).schedules()

    def _add_listener(self, queue: Queue, spec: ListenOptions) -> None:
        if queue.name in self.listeners:
            raise InvalidInput(f"queue {queue.name!r} is already listened to by this client")
        # a fail queue's jobs run its queue's fail handler: a handler of its own would
        # replace that one in the workers' {queue: handler} (the last listed wins)
        suffix = defaults.FAIL_QUEUE_SUFFIX
        for name, (_, other) in self.listeners.items():
            if other.fail_handler is not None and name + suffix == queue.name:
                raise InvalidInput(f"queue {queue.name!r} is the fail queue of {name!r}")
            if spec.fail_handler is not None and queue.name + suffix == name:
                raise InvalidInput(f"queue {name!r} is the fail queue of {queue.name!r}")
        self.listeners[queue.name] = (queue, spec)

    def run(self, connect: Callable[[Client], object] | None = None) -> int:
        """Supervise the listened queues until SIGTERM/SIGINT. Returns an exit code.

        The first workers are started before anything else (runtime/early.py): their start
        overlaps importing redis-py, connecting, loading the library and the supervisor's own
        start. `connect(client)` connects and loads the library then (default: ready();
        `queasy run` waits there for a server that is down); its errors stop the workers."""
        if not self.listeners:
            raise QueasyError("run() needs at least one queue.listen(...) first")
        if self.settings["workers"] == 0:
            raise QueasyError("this client was made with workers=0 (producer only): it cannot run")
        if not self._running.acquire(blocking=False):
            # two supervisors under one client id would share its leases and heartbeat,
            # neither knowing the jobs the other runs
            raise QueasyError("run() is already running on this client (one supervisor each)")
        try:
            return self._run(connect or Client.ready)
        finally:
            with self._stopping:
                self._stop_asked = False  # a stop() of this run() never stops the next one
                self._running.release()

    def _run(self, connect: Callable[[Client], object]) -> int:
        from .runtime.early import early_for, sigterm_interrupts, start_early

        with sigterm_interrupts():  # SIGTERM before the supervisor ran: its workers stopped
            early, supervisor = early_for(self), None
            try:  # the workers not adopted (a refused connection, a bad config) are stopped
                start_early(self, early)
                connect(self)
                from .runtime.supervisor import Supervisor

                supervisor = Supervisor(self, early)
                with self._stopping:
                    self._supervisor = supervisor
                    if self._stop_asked:  # stop() came while run() started
                        supervisor.request_stop()
                if self.server is not None:
                    self.server.long_lived = True
                return supervisor.run()
            finally:
                early.close()
                if supervisor is not None:  # adopted, but its run() stopped before its
                    supervisor.workers.close()  # try (Ctrl-C): none left (else a no-op)
                self._supervisor = None

    def stop(self) -> None:
        """Ask a running run() to shut down gracefully (callable from any thread); while run()
        still starts, its supervisor stops as soon as it is made. No-op when nothing runs."""
        with self._stopping:
            supervisor = self._supervisor
            if supervisor is None:
                self._stop_asked = self._running.locked()
                return
        supervisor.request_stop()

    def close(self) -> None:
        self.closes += 1  # first: a waiter whose connection this closes knows why
        redis_client = getattr(self, "_redis", None)  # None: the URL was refused
        if redis_client is not None:
            redis_client.close()
        if self.server is not None:
            self.server.close()
            self.server = None

    def __enter__(self) -> Client:
        """Connects (ready()), as `async with AsyncClient(...)` does."""
        try:
            return self.ready()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
