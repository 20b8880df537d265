"""Reads of a whole prefix at once (`queasy status`, the dashboard's overview) that go on
past a Redis Cluster primary that does not answer (killed or frozen, not failed over yet).

Each read names the key it reads; on a cluster with `partial`, a read that fails with a
connection error or a timeout marks the primary that owns the key's slot as down, and the
later reads of keys on that primary are not tried (a frozen primary costs one socket
timeout, not one per queue): they give Unreachable instead. On a single server, or without
`partial` (Client.queues(), supervisors(), schedules()), every error is raised as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from . import records
from .connfailed import unreachable
from .errors import AuthenticationFailed, ConnectionFailed, InvalidInput
from .queue import Queue
from .store import fields
from .store.keys import RegistryKeys, schedule_pattern, schedule_queue
from .store.lazyredis import redis

if TYPE_CHECKING:
    from collections.abc import Callable

    from .client import Client
    from .job import ScheduleInfo

T = TypeVar("T")

#: the parts of a prefix read from one key (or a scan) that Reach.missed names
QUEUE_NAMES, SUPERVISORS, SCHEDULES = "queue names", "supervisors", "schedules"


@dataclass(frozen=True)
class Unreachable:
    """A primary that did not answer: `node` is host:port (never credentials), `error`
    redis-py's error class and message."""

    node: str
    error: str


@dataclass
class Reach:
    client: Client
    partial: bool = True
    down: dict[str, Unreachable] = field(default_factory=dict)  # by node
    queues: dict[str, str] = field(default_factory=dict)  # queue name -> its node, not read
    parts: dict[str, list[str]] = field(default_factory=dict)  # part -> the nodes it missed

    @property
    def on(self) -> bool:
        """Whether reads go on past a down primary (a cluster, partial asked for)."""
        return self.partial and self.client.cluster

    @property
    def complete(self) -> bool:
        return not self.down

    def read(self, key: str, call: Callable[[], T]) -> T | Unreachable:
        """call() (which reads `key`), or Unreachable when the primary of `key` is down."""
        if not self.on:
            return call()
        return self._on(self.node(key), call)

    def node(self, key: str) -> str:
        from .store.cluster import slot_owner

        host, port = slot_owner(self.client.redis, key)
        return f"{host}:{port}"

    def _on(self, node: str, call: Callable[[], T]) -> T | Unreachable:
        if node in self.down:
            return self.down[node]
        try:
            return call()
        except (redis.AuthenticationError, AuthenticationFailed):
            raise
        except Exception as exc:
            if isinstance(exc, ConnectionFailed):  # a public call's (connfailed.py)
                exc = exc.__cause__ or exc  # redis-py's error
            elif not unreachable(exc):  # (redis-py's RedisClusterException too: no node
                raise  # answers, or none serves the key's slot)
            self.down[node] = Unreachable(node, f"{type(exc).__name__}: {exc}")
            return self.down[node]

    def missed(self, part: str, down: Unreachable) -> None:
        nodes = self.parts.setdefault(part, [])
        if down.node not in nodes:
            nodes.append(down.node)

    def summary(self) -> dict[str, Any]:
        """What could not be read, for `--json`: the nodes (host:port and error), the queues
        (name -> node) and the parts (part -> nodes)."""
        return {
            "nodes": [{"node": d.node, "error": d.error} for d in self.down.values()],
            "queues": dict(sorted(self.queues.items())),
            "parts": self.parts,
        }

    # ------------------------------------------------------------ the prefix's registry

    def queue_names(self) -> list[str]:
        """Client.queues(); [] when the registry's primary is down."""
        key = RegistryKeys(self.client.prefix).queues
        names = self.read(key, lambda: self.client.redis.smembers(key))
        if isinstance(names, Unreachable):
            self.missed(QUEUE_NAMES, names)
            return []
        return sorted(map(fields.text, names))

    def supervisors(self) -> list[dict[str, Any]]:
        """Client.supervisors(); [] when the registry's primary is down. The server's time
        is asked of that primary too (TIME has no key: redis-py sends it to any node)."""
        key = RegistryKeys(self.client.prefix).supervisors

        def call() -> list[dict[str, Any]]:
            seconds, micros = self._time_at(key)
            entries = self.client.redis.hgetall(key).values()
            return records.live(entries, seconds + micros / 1e6)

        got = self.read(key, call)
        if isinstance(got, Unreachable):
            self.missed(SUPERVISORS, got)
            return []
        return got

    def server_time(self) -> float:
        """The server's clock (epoch seconds), on a cluster that of a primary that answers
        (the registry's first)."""
        keys = RegistryKeys(self.client.prefix)
        for key in (keys.supervisors, keys.queues):
            got = self.read(key, lambda k=key: self._time_at(k))  # type: ignore[misc]
            if not isinstance(got, Unreachable):
                return got[0] + got[1] / 1e6
        for node in self._primaries():  # both registry primaries down: any other one
            got = self._on(node, lambda n=node: self._node_client(n).time())  # type: ignore[misc]
            if not isinstance(got, Unreachable):
                return got[0] + got[1] / 1e6
        raise redis.ConnectionError("no primary of the cluster answers")

    def _time_at(self, key: str) -> Any:
        if not self.client.cluster:
            return self.client.redis.time()
        return self._node_client(self.node(key)).time()

    def _primaries(self) -> list[str]:
        return [f"{n.host}:{n.port}" for n in self.client.redis.get_primaries()]

    def _node_client(self, node: str) -> Any:
        rc = self.client.redis
        return rc.get_redis_connection(rc.get_node(node_name=node))

    # ------------------------------------------------------------ schedules

    def scan(self, match: str, part: str) -> list[str]:
        """The keys matching `match`, on a cluster those of every primary that answers."""
        if not self.on:
            return [fields.text(k) for k in self.client.redis.scan_iter(match=match, count=1000)]
        keys: list[str] = []
        for node in self._primaries():
            got = self._on(
                node,
                lambda n=node: list(self._node_client(n).scan_iter(match=match, count=1000)),  # type: ignore[misc]
            )
            if isinstance(got, Unreachable):
                self.missed(part, got)
            else:
                keys.extend(map(fields.text, got))
        return keys

    def schedules(self) -> dict[str, ScheduleInfo]:
        """Client.schedules(), those of the primaries that answer."""
        prefix, out = self.client.prefix, {}
        for key in self.scan(schedule_pattern(prefix), SCHEDULES):
            found = schedule_queue(prefix, key)
            if found is None:
                continue
            try:
                queue = Queue(self.client, found[0], found[1])
                info = self.read(queue.keys.base, queue.schedule_info)
            except InvalidInput:  # not a queue's key (a job id ending in ':schedule')
                continue
            if isinstance(info, Unreachable):
                self.missed(SCHEDULES, info)
            elif info is not None:
                out[info.queue] = info
        return dict(sorted(out.items()))
