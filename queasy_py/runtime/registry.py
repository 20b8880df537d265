"""What a supervisor publishes about itself with each heartbeat, for Client.supervisors() and
Client.queues(): its host, pid, start time, queues, workers, free units and the jobs it runs,
as JSON in `<prefix>:supervisors` (client id -> entry), and its queue names in
`<prefix>:queues`. `results` names the queues whose ends it publishes (store_results):
Queue.result() waits on a job's channel there, on the outcome events elsewhere. An entry
says until when it holds (`expires_at`, on the server's clock); entries past it are pruned
by the next supervisor's beat."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

import orjson
import redis

from ..store.keys import RegistryKeys

#: beats between two prunes of entries whose supervisor is gone
PRUNE_EVERY = 12


class Registry:
    def __init__(
        self,
        prefix: str,
        queues: list[str],
        state: Callable[[], dict[str, Any]],
        results: list[str] | None = None,
    ):
        """`results`: the queues that store results; `state()` gives the changing part of
        the entry (workers, units, jobs); it is called from the heartbeat thread, so it
        copies what it reads."""
        self.keys = RegistryKeys(prefix)
        self.queues = sorted(queues)
        self.results = sorted(results or [])
        self.state = state
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.started_at = time.time()
        self.beats = 0
        self.left = False  # it shut down: a late beat must not publish it again

    def entry(self, client_id: str, server_now: float, expiry_s: float) -> bytes:
        try:
            state = self.state()
        except RuntimeError:  # a dict changed while it was copied: the next beat has it
            state = {}
        return orjson.dumps(
            {
                "id": client_id,
                "host": self.host,
                "pid": self.pid,
                "started_at": round(self.started_at, 3),
                "queues": self.queues,
                "results": self.results,
                **state,
                "beat_at": round(server_now, 3),
                "expires_at": round(server_now + expiry_s, 3),
            }
        )

    def add(self, pipe: Any, client_id: str, server_now: float, expiry_s: float) -> None:
        """Queue the writes of one beat on `pipe`."""
        if self.left:
            return
        pipe.hset(self.keys.supervisors, client_id, self.entry(client_id, server_now, expiry_s))
        pipe.sadd(self.keys.queues, *self.queues)

    def prune(self, r: redis.Redis, server_now: float) -> None:
        """Every PRUNE_EVERY beats: drop the entries past their expiry."""
        self.beats += 1
        if self.beats % PRUNE_EVERY:
            return
        gone = [
            client
            for client, raw in r.hgetall(self.keys.supervisors).items()
            if expires_at(raw) < server_now
        ]
        if gone:
            r.hdel(self.keys.supervisors, *gone)

    def leave(self, r: redis.Redis, client_id: str) -> None:
        self.left = True
        r.hdel(self.keys.supervisors, client_id)


def expires_at(raw: Any) -> float:
    """The expiry of an entry (0 for one that does not parse: pruned, never listed)."""
    try:
        value = orjson.loads(raw).get("expires_at")
    except (orjson.JSONDecodeError, AttributeError):
        return 0.0
    return float(value) if isinstance(value, int | float) else 0.0
