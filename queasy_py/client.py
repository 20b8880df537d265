"""Client: one process's connection to Redis, its queues and (when listening) its supervisor."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import redis

from . import defaults
from .errors import InvalidInput, QueasyError
from .options import check_setting
from .queue import Queue
from .store import fields
from .store.calls import FastCall
from .store.connection import connect, mask_url, new_client_id
from .store.keys import schedule_pattern, schedule_queue
from .store.library import ensure_loaded

if TYPE_CHECKING:
    from .job import ScheduleInfo
    from .options import ListenOptions
    from .runtime.supervisor import Supervisor
    from .store.embedded import EmbeddedServer

log = logging.getLogger("queasy_py")


class Client:
    """A connection to Redis. `url` None: $QUEASY_REDIS_URL, else an embedded server.

    `workers` is the number of worker subprocesses a supervisor started by run() uses
    (default os.cpu_count(); 0 makes a producer-only client). Other supervisor settings
    (see queasy_py/defaults.py SUPERVISOR) are keyword arguments.
    """

    def __init__(
        self,
        url: str | None = None,
        workers: int | None = None,
        *,
        prefix: str = defaults.PREFIX,
        max_payload: int = defaults.MAX_PAYLOAD_BYTES,
        **settings: Any,
    ) -> None:
        unknown = set(settings) - set(defaults.SUPERVISOR)
        if unknown:
            raise InvalidInput(f"unknown Client settings: {sorted(unknown)}")
        for key, value in {**settings, "workers": workers}.items():
            check_setting(key, value)
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise InvalidInput(f"invalid key prefix {prefix!r}: a non-empty str without braces")
        self.prefix = prefix
        self.max_payload = max_payload
        self.settings: dict[str, Any] = {**defaults.SUPERVISOR, **settings, "workers": workers}
        self.server: EmbeddedServer | None = None
        url = url or os.environ.get(defaults.URL_ENV) or None
        if url is None:
            from .store.embedded import EmbeddedServer

            self.server = EmbeddedServer().start()
            url = self.server.url
            log.info("no Redis URL given: using an embedded server at %s", mask_url(url))
        self.url = url
        self.redis: redis.Redis = connect(url)
        self.fastcall = FastCall(self.redis)
        try:
            self.library_version = ensure_loaded(self.redis)
        except BaseException:
            self.close()
            raise
        self.id = new_client_id()
        self._queues: dict[str, Queue] = {}
        self._supervisor: Supervisor | None = None
        self.listeners: dict[str, tuple[Queue, ListenOptions]] = {}

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

    def schedules(self) -> dict[str, ScheduleInfo]:
        """The schedule of every queue (under this client's prefix) that has one, by queue
        name: its spec, the current occurrence's fire time and state, the last outcome."""
        out = {}
        for key in self.redis.scan_iter(match=schedule_pattern(self.prefix), count=1000):
            found = schedule_queue(self.prefix, fields.text(key))
            if found is None:
                continue
            try:
                info = Queue(self, found[0], found[1]).schedule_info()
            except InvalidInput:  # not a queue's key (a job id ending in ':schedule')
                continue
            if info is not None:
                out[info.queue] = info
        return dict(sorted(out.items()))

    def _add_listener(self, queue: Queue, spec: ListenOptions) -> None:
        if queue.name in self.listeners:
            raise InvalidInput(f"queue {queue.name!r} is already listened to by this client")
        self.listeners[queue.name] = (queue, spec)

    def run(self) -> int:
        """Supervise the listened queues until SIGTERM/SIGINT. Returns an exit code."""
        from .runtime.supervisor import Supervisor

        if not self.listeners:
            raise QueasyError("run() needs at least one queue.listen(...) first")
        if self.settings["workers"] == 0:
            raise QueasyError("this client was made with workers=0 (producer only): it cannot run")
        self._supervisor = Supervisor(self)
        try:
            return self._supervisor.run()
        finally:
            self._supervisor = None

    def stop(self) -> None:
        """Ask a running run() to shut down gracefully (callable from any thread)."""
        supervisor = self._supervisor
        if supervisor is not None:
            supervisor.request_stop()

    def close(self) -> None:
        self.redis.close()
        if self.server is not None:
            self.server.stop()
            self.server = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
