"""Handing back what this client holds but does not know of: stop the pushes to it and take
in those already on their way (each queue's unpark publishes a mark after them), then hand
back every lease that is neither running on a worker nor waiting to be acked."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import redis

from ..store.library import fcall
from ..store.upgrading import read_converting
from .scheduler import QueueState

if TYPE_CHECKING:
    from ..store.pubsub import Message, Wakeup

log = logging.getLogger("queasy_py")

#: seconds to wait for the marks of queasy_unpark (every job pushed before has arrived)
UNPARK_WAIT = 2.0


def unpark_all(
    r: redis.Redis,
    states: Mapping[str, QueueState],
    client_id: str,
    wakeup: Wakeup,
    marks: set[bytes],
    on_messages: Callable[[list[Message]], None],
) -> None:
    """Stop jobs being pushed to this client, and take in every job pushed before: each
    queue's unpark publishes a mark after them on the push channel (`marks` collects the
    marks seen; `on_messages` takes the pushes read meanwhile)."""
    sent = {state.base: f"unpark-{uuid.uuid4().hex}".encode() for state in states.values()}
    with r.pipeline(transaction=False) as pipe:  # one round trip for every queue
        for base, mark in sent.items():
            fcall(pipe, "queasy_unpark", [base], ["", client_id, mark])
        replies = pipe.execute()
    pairs = zip(sent.values(), replies, strict=True)
    expected = {mark for mark, (_, receivers) in pairs if receivers}
    deadline = time.monotonic() + UNPARK_WAIT
    while expected - marks and wakeup.connected:
        left = deadline - time.monotonic()
        if left <= 0:  # never read this connection again: what it held is handed back
            log.error("the pushed jobs did not arrive in %.3gs; reconnecting", UNPARK_WAIT)
            wakeup.close()
            break
        on_messages(wakeup.read(timeout=left))
    marks.clear()


def hand_back_unknown(
    r: redis.Redis,
    states: Mapping[str, QueueState],
    client_id: str,
    held: set[str],
    kind: str = "release",
) -> None:
    """Hand back to waiting every lease of this client whose token is not in `held` (a
    dequeue whose reply was lost, a finish the server lost): not counted (`release`), or
    with `stall` counted as a sweep would (a client this process gave up, its workers
    killed)."""
    for state in states.values():
        pairs = read_converting(r, "queasy_leases", state.base, "", client_id)
        lost = [
            (pairs[i].decode(), pairs[i + 1].decode())
            for i in range(0, len(pairs), 2)
            if pairs[i + 1].decode() not in held
        ]
        for job_id, token in lost:
            if kind == "release":
                log.warning(
                    "handing back job %s of %s (its dequeue reply was lost)", job_id, state.name
                )
                args = [job_id, token, "+0", "release", "", "", "", "", ""]
            else:
                log.warning(
                    "handing back job %s of %s (leased to %s, a client id this process gave up)",
                    job_id,
                    state.name,
                    client_id,
                )
                why = f"its supervisor gave up client {client_id} (it was swept as dead)"
                args = [job_id, token, "+0", kind, "", "", "StallError", why, ""]
            fcall(r, "queasy_retry", [state.base], ["", client_id, state.spec.events_maxlen, *args])
        if kind != "release":
            fcall(r, "queasy_leave", [state.base], ["", client_id])
        state.ready_at = 0.0  # dequeue next round, which parks the free slots again
