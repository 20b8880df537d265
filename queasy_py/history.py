"""The job-event history: the outcome-event streams of queues, found and read.

Every outcome (finished, retried, failed, stalled, timed out, released, cancelled) appends one
entry to its queue's capped stream, in the same FCALL as the change (README, "Failure
semantics"). This is the public reader of those streams (the Spark events source uses it):
`History(client).streams()` finds them, `end()` says where one ends, `read()` reads a range.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import defaults, validate
from .errors import InvalidInput
from .store import events
from .store.events import StreamEnd, entry_id
from .store.keys import QueueKeys

if TYPE_CHECKING:
    from .client import Client

__all__ = ["EventStream", "History", "StreamEnd", "entry_id"]

#: an entry: (stream entry id, its fields)
Entry = tuple[str, dict[str, str]]


@dataclass(frozen=True, slots=True)
class EventStream:
    """The outcome-event stream of one queue (`tag`: the hash tag it shares)."""

    queue: str
    tag: str
    key: str

    @property
    def ref(self) -> str:
        return stream_ref(self.queue, self.tag)


def stream_ref(queue: str, tag: str) -> str:
    """The short unique name of a queue's stream (EventStream.ref, the key of its offsets):
    the queue's, or `{tag}name` for a fail queue."""
    return queue if tag == queue else f"{{{tag}}}{queue}"


class History:
    """The outcome-event streams of one client's key prefix."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def stream(self, queue: str, tag: str | None = None) -> EventStream:
        name = validate.queue_name(queue)
        keys = QueueKeys(self.client.prefix, name, validate.queue_name(tag or name))
        return EventStream(name, keys.tag, keys.events)

    def streams(
        self, queues: Iterable[str] | None = None, fail_queues: bool = True
    ) -> list[EventStream]:
        """The streams of `queues` (each with its fail queue's when `fail_queues`), whether
        or not they hold events yet; None: every stream that exists (a SCAN of the keys)."""
        if queues is None:
            found = events.stream_keys(self.client.redis, self.client.prefix)
            out = [EventStream(name, tag, key) for key, tag, name in found]
            if not fail_queues:
                out = [s for s in out if s.tag == s.queue]
            return out
        names = list(queues)
        if not names:
            raise InvalidInput("give at least one queue name (or None for every queue)")
        out = []
        for name in names:
            out.append(self.stream(name))
            if fail_queues:
                out.append(self.stream(name + defaults.FAIL_QUEUE_SUFFIX, name))
        return out

    def end(self, stream: EventStream) -> StreamEnd:
        """Where the stream ends now (its last id, entries ever added, entries held)."""
        return events.stream_end(self.client.redis, stream.key)

    def head(self, stream: EventStream, after: str, count: int) -> tuple[StreamEnd, list[str]]:
        """The stream's end and the ids of up to `count` entries after `after`, read at once."""
        events.entry_id(after, "after")
        return events.head(self.client.redis, stream.key, after, _positive("count", count))

    def recent(self, stream: EventStream, since: float, count: int = 1000) -> list[dict[str, Any]]:
        """The newest `count` events (at most 10,000) written at or after `since` (epoch
        seconds, the server's clock), oldest first, typed as `Queue.events()` gives them."""
        if (
            isinstance(since, bool)
            or not isinstance(since, int | float)
            or not 0 <= since <= validate.MAX_RUN_AT  # inf: an OverflowError before
        ):
            raise InvalidInput(
                f"since must be epoch seconds within 0..{validate.MAX_RUN_AT}, "
                f"not {validate.shown(since)}"
            )
        return events.recent(self.client.redis, stream.key, int(since * 1000), count)

    def read(
        self, stream: EventStream, after: str = "0-0", until: str = "+", chunk: int = 10_000
    ) -> Iterator[list[Entry]]:
        """The entries with ids in (after, until], in lists of up to `chunk`."""
        events.entry_id(after, "after")
        if until != "+":
            events.entry_id(until, "until")
        chunk = _positive("chunk", chunk)
        return events.entries(self.client.redis, stream.key, after, until, chunk)


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"{name} must be an int >= 1, not {validate.shown(value)}")
    return value
