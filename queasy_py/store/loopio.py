"""The scheduling loop's own connections, for a single server or a Redis Cluster alike: the
round pipe (store/pipe.py; store/clusterpipe.py, one per primary) and the wake-up listener
(store/pubsub.py; store/clusterwake.py, one subscription per primary). The runtime asks for
these by URL and never learns which it got. The cluster modules are imported for a cluster
URL only (a single server's supervisor starts without them: about 7 ms of CPU)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .connection import is_cluster_url
from .pipe import RedisPipe
from .pubsub import Wakeup

if TYPE_CHECKING:
    from .clusterpipe import ClusterPipe
    from .clusterwake import ClusterWakeup


def round_pipe(url: str) -> RedisPipe | ClusterPipe:
    if is_cluster_url(url):
        from .clusterpipe import ClusterPipe

        return ClusterPipe(url)
    return RedisPipe(url)


def wakeup(url: str, channels: Mapping[str, tuple[str, str]]) -> Wakeup | ClusterWakeup:
    if is_cluster_url(url):
        from .clusterwake import ClusterWakeup

        return ClusterWakeup(url, channels)
    return Wakeup(url, channels)
