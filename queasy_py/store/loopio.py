"""The scheduling loop's own connections, for a single server or a Redis Cluster alike: the
round pipe (store/pipe.py; store/clusterpipe.py, one per primary) and the wake-up listener
(store/pubsub.py; store/clusterwake.py, one subscription per primary). The runtime asks for
these by URL and never learns which it got."""

from __future__ import annotations

from collections.abc import Mapping

from .cluster import is_cluster_url
from .clusterpipe import ClusterPipe
from .clusterwake import ClusterWakeup
from .pipe import RedisPipe
from .pubsub import Wakeup


def round_pipe(url: str) -> RedisPipe | ClusterPipe:
    return ClusterPipe(url) if is_cluster_url(url) else RedisPipe(url)


def wakeup(url: str, channels: Mapping[str, tuple[str, str]]) -> Wakeup | ClusterWakeup:
    return ClusterWakeup(url, channels) if is_cluster_url(url) else Wakeup(url, channels)
