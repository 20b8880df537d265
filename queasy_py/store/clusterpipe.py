"""The scheduling loop's rounds on a Redis Cluster: one pipelined connection (a RedisPipe) per
primary, each command sent to the primary that owns its queue's slot, the replies of a round
put back in the order of its commands.

A round's commands are split by node and sent at once; the round's callback runs when every
node has answered its part and every round sent before it has run its own. What the cluster
says "not here, not now" is a reply, never a crash: MOVED, ASK (the slot moves), TRYAGAIN
(the library's migration guard), CLUSTERDOWN, and a part lost with its node's connection (a
TryAgainError naming the node) reach the round's callback as error replies, which the loop
treats as an outage of that call (its acks kept and sent again after a backoff, its dequeue
released; runtime/outage.py). MOVED, ASK, a lost node or CLUSTERDOWN mark the slot map
stale: it is read again before the next round.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import RedisClusterException

from .cluster import loop_cluster_client, node_client, primaries, refresh, slot_owner
from .pipe import RedisPipe, Reply

log = logging.getLogger("queasy_py")

Node = tuple[str, int]
#: error replies after which the slot map is read again
_REMAP = (redis.exceptions.AskError, redis.exceptions.ClusterDownError)  # MOVED is an ASK


class NodeLost(redis.exceptions.TryAgainError):
    """The reply to a command whose node's connection broke before it answered (the command
    may or may not have run: the loop treats it as a lost reply, and reconciles)."""


class NodePipe(RedisPipe):
    """A RedisPipe to one node of the cluster."""

    def __init__(self, url: str, node: Node) -> None:  # RedisPipe's state, on a node's client
        self._client = node_client(url, *node)
        self._conn = None
        self.inflight = deque()

    def read(self, block: bool = False) -> None:
        """RedisPipe.read, but an idle connection (nothing in flight) is dropped only when
        its socket is readable (the server closed it): the loop reads every primary's pipe
        when one of them is readable, and a primary the last rounds did not need must keep
        its connection (it was reconnected, AUTH and all, for most rounds otherwise)."""
        if not self.inflight and self._conn is not None:
            try:
                if not self._conn.can_read(timeout=0):
                    return
            except (redis.RedisError, OSError):
                pass  # closed: RedisPipe.read resets it
        super().read(block)


@dataclass(eq=False)
class Round:
    size: int
    on_reply: Callable[[list[Reply]], None]
    on_error: Callable[[BaseException], None]
    parts: int = 0
    replies: list[Reply] = field(default_factory=list)
    lost: BaseException | None = None  # a part lost with its connection
    answered: int = 0  # parts whose replies are all in


def command_key(command: Sequence[Any]) -> str | None:
    """The key a loop command is routed by: FCALL's first key (every loop command is one)."""
    if len(command) > 3 and str(command[0]).upper() in ("FCALL", "FCALL_RO"):
        if int(command[2]) > 0:
            key = command[3]
            return key.decode() if isinstance(key, bytes) else str(key)
    return None


class ClusterPipe:
    """RedisPipe's interface (send, read, inflight, socket, fail, reset, close) over one
    RedisPipe per primary."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._rc: Any = None  # the slot map (a ClusterClient, made on the first send)
        self.pipes: dict[Node, NodePipe] = {}
        self.owners: dict[str, Node] = {}  # key -> primary, from the slot map
        self.inflight: list[Round] = []
        self.stale = False  # read the slot map again before the next round

    def socket(self) -> tuple[Any, ...]:
        """The sockets to watch for replies (one per connected primary)."""
        socks = (pipe.socket() for _, pipe in sorted(self.pipes.items()))
        return tuple(s for s in socks if s is not None)

    def _map(self) -> None:
        if self._rc is None:
            self._rc = loop_cluster_client(self.url)
            self.stale = False
        elif self.stale:
            refresh(self._rc)
            self.stale = False
            self.owners.clear()
            live = set(primaries(self._rc))
            for node in [n for n, p in self.pipes.items() if n not in live and not p.inflight]:
                self.pipes.pop(node).close()  # no longer a primary (failed over, removed)

    def _owner(self, key: str | None) -> Node:
        if key is None:
            return primaries(self._rc)[0]
        owner = self.owners.get(key)
        if owner is None:
            try:
                owner = self.owners[key] = slot_owner(self._rc, key)
            except RedisClusterException as exc:  # a slot no node serves now
                self.stale = True
                raise redis.ConnectionError(f"no primary serves the slot of {key}: {exc}") from None
        return owner

    def send(
        self,
        commands: Sequence[Sequence[Any]],
        on_reply: Callable[[list[Reply]], None],
        on_error: Callable[[BaseException], None],
    ) -> None:
        """Send `commands`, each to its key's primary; `on_reply(replies)` (in the order of
        `commands`) once every primary has answered. redis.ConnectionError when the slot
        map cannot be read or every part was lost at once (nothing was sent then)."""
        if not commands:
            on_reply([])
            return
        self._map()
        groups: dict[Node, list[int]] = {}
        for i, command in enumerate(commands):
            groups.setdefault(self._owner(command_key(command)), []).append(i)
        rnd = Round(len(commands), on_reply, on_error, parts=len(groups))
        rnd.replies = [None] * len(commands)
        self.inflight.append(rnd)
        sent = 0
        for node, indexes in groups.items():
            pipe = self.pipes.get(node)
            if pipe is None:
                pipe = self.pipes[node] = NodePipe(self.url, node)
            part = [commands[i] for i in indexes]
            try:
                pipe.send(
                    part,
                    lambda replies, idx=indexes: self._part(rnd, idx, replies),
                    lambda exc, idx=indexes, n=node: self._part_lost(rnd, idx, n, exc),
                )
                sent += 1
            except (redis.RedisError, OSError) as exc:
                if sent == 0 and len(groups) == 1:
                    self.inflight.remove(rnd)
                    self.stale = True
                    raise
                self._part_lost(rnd, indexes, node, exc)

    def _part(self, rnd: Round, indexes: list[int], replies: list[Reply]) -> None:
        for i, reply in zip(indexes, replies, strict=True):
            if isinstance(reply, _REMAP):
                self.stale = True
            rnd.replies[i] = reply
        self._answered(rnd)

    def _part_lost(self, rnd: Round, indexes: list[int], node: Node, exc: BaseException) -> None:
        self.stale = True
        lost = NodeLost(f"the connection to {node[0]}:{node[1]} broke: {exc}")
        for i in indexes:
            rnd.replies[i] = lost
        rnd.lost = exc
        self._answered(rnd)

    def _answered(self, rnd: Round) -> None:
        """A part is in. Complete rounds are handed over in the order they were sent (as
        RedisPipe does): one whose parts are in waits for the rounds sent before it."""
        rnd.answered += 1
        while self.inflight and self.inflight[0].answered == self.inflight[0].parts:
            done = self.inflight.pop(0)
            if done.lost is not None and all(isinstance(r, NodeLost) for r in done.replies):
                done.on_error(done.lost)  # every reply lost: as a broken connection
            else:
                done.on_reply(done.replies)

    def read(self, block: bool = False) -> None:
        """Read every reply that has arrived (with `block`, wait for all in flight)."""
        for pipe in list(self.pipes.values()):
            pipe.read(block)

    def deadline(self) -> float:
        """The earliest deadline of a primary's pipe (RedisPipe.deadline)."""
        return min((pipe.deadline() for pipe in self.pipes.values()), default=float("inf"))

    def expire(self, now: float) -> None:
        """A primary's part with no reply in time is lost, as its broken connection's
        (RedisPipe.expire)."""
        for pipe in list(self.pipes.values()):
            pipe.expire(now)

    def fail(self, exc: BaseException) -> None:
        for pipe in list(self.pipes.values()):
            pipe.fail(exc)

    def reset(self) -> None:
        self.fail(redis.ConnectionError("the round pipe was reset"))

    def close(self) -> None:
        for pipe in self.pipes.values():
            pipe.close()
        self.pipes.clear()
        self.inflight.clear()
        if self._rc is not None:
            self._rc.close()
            self._rc = None
