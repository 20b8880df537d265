"""Wake-ups and pushed jobs on a Redis Cluster: the Wakeup interface (store/pubsub.py) over one
sharded subscription per primary, each to the channels of the queues whose slots it owns.

A sharded message reaches the subscribers of its shard only, and the library counts them with
PUBSUB SHARDNUMSUB on the primary that runs the call, so each channel is subscribed on its
slot's primary. When a slot moves (resharding, failover) the node ends the subscription or the
connection breaks: that node's Wakeup reports `lost` (the supervisor reconciles its leases)
and this reads the slot map again, with backoff, and subscribes where the channels are now.
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Mapping
from typing import Any

import redis
from redis.exceptions import RedisClusterException

from ..errors import ConnectionFailed
from .cluster import loop_cluster_client, node_client, refresh, slot_owner
from .pubsub import Message, Wakeup

log = logging.getLogger("queasy_py")

Node = tuple[str, int]


class ClusterWakeup:
    def __init__(self, url: str, channels: Mapping[str, tuple[str, str]]) -> None:
        """`channels` maps a channel to its (kind, queue name)."""
        self.url = url
        self.channels = dict(channels)
        self._rc: Any = None
        self.nodes: dict[Node, Wakeup] = {}
        self.stale = True  # group the channels by primary again (read the slot map first)
        self.retry_at = 0.0
        self.delay = 0.1
        self._lost = False

    @property
    def lost(self) -> bool:
        """The subscriptions broke since the supervisor last looked (a push may be lost)."""
        return self._lost or any(w.lost for w in self.nodes.values())

    @lost.setter
    def lost(self, value: bool) -> None:
        self._lost = value
        for wakeup in self.nodes.values():
            wakeup.lost = value

    @property
    def connected(self) -> bool:
        return bool(self.nodes) and all(w.connected for w in self.nodes.values())

    def socket(self) -> tuple[Any, ...]:
        """The sockets to watch (one per primary subscribed to)."""
        socks = (w.socket() for _, w in sorted(self.nodes.items()))
        return tuple(s for s in socks if s is not None)

    def set_channels(self, channels: Mapping[str, tuple[str, str]]) -> None:
        """Listen on `channels` instead (a new client id): resubscribe at once."""
        if dict(channels) == self.channels:
            return
        self.channels = dict(channels)
        self.stale = True
        self.retry_at = 0.0
        self.ensure()

    def recheck(self) -> None:
        """Read the slot map again at the next ensure() and subscribe where the channels are
        now: a primary that went silent (frozen, cut off) never ends its subscriptions, so
        nothing else tells this that the cluster failed it over (the supervisor calls this
        when it reconciles: after an outage, and every RECONCILE_INTERVAL)."""
        self.stale = True
        self.retry_at = 0.0

    def ensure(self) -> None:
        """Subscribe where the channels are, when not subscribed and the backoff has passed."""
        if any(not w.connected for w in self.nodes.values()):
            self.stale = True  # a node broke or ended a subscription: its slots may have moved
        if self.stale and time.monotonic() >= self.retry_at:
            try:
                self._regroup()
            except (redis.RedisError, OSError, RedisClusterException, ConnectionFailed) as exc:
                log.warning(
                    "wake-up listener cannot read the cluster's slot map: %s (polling "
                    "meanwhile; retry in %.1fs)", exc, self.delay,
                )  # fmt: skip
                self._lost = True
                self.retry_at = time.monotonic() + self.delay
                self.delay = min(self.delay * 2, 5.0)
                return
        for wakeup in self.nodes.values():
            wakeup.ensure()
        if self.nodes and self.connected:
            self.delay = 0.1

    def _regroup(self) -> None:
        if self._rc is None:
            self._rc = loop_cluster_client(self.url)
        else:
            refresh(self._rc)
        groups: dict[Node, dict[str, tuple[str, str]]] = {}
        for channel, route in self.channels.items():
            groups.setdefault(slot_owner(self._rc, channel), {})[channel] = route
        for node in [n for n in self.nodes if n not in groups]:
            self.nodes.pop(node).close()
            self._lost = True
        for node, group in groups.items():
            wakeup = self.nodes.get(node)
            if wakeup is None:
                self.nodes[node] = Wakeup(
                    self.url, group, connect=lambda n=node: node_client(self.url, *n)
                )
            else:
                wakeup.set_channels(group)
        self.stale = False
        # a broken node is tried again after its own backoff; the map is read again after ours
        self.retry_at = time.monotonic() + self.delay

    def read(self, timeout: float = 0.0) -> list[Message]:
        """Every message that has arrived, waiting up to `timeout` seconds for the first."""
        socks = self.socket()
        if timeout > 0 and socks:
            try:
                select.select(socks, [], [], timeout)
            except (OSError, ValueError):
                pass  # a socket closed meanwhile: its Wakeup finds out below
        out: list[Message] = []
        for wakeup in list(self.nodes.values()):
            out += wakeup.read()
        return out

    def close(self) -> None:
        for wakeup in self.nodes.values():
            wakeup.close()
        self.nodes.clear()
        self.stale = True
        if self._rc is not None:
            self._rc.close()
            self._rc = None
