"""The one reader of a queue's outcome-event stream (`<base>:events`, written by the library
in the FCALL of each outcome). The operator commands, the metrics and the Spark pipeline
read it through here; its schema (README "Outcome events") is versioned with the library.

An event is a dict: `event_id` (the stream entry id, the cursor to read on from), the text
fields `id, queue, outcome, client, error_name, error_kind, error_message, traceback`, and
the integer fields `run_at, started_at, ended_at, enqueued_at` (ms since the epoch), `pid,
retry_count, stall_count, timeout_count` (None where the library wrote '': unknown).
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidInput
from . import fields

#: the integer fields of an event ('' in the stream: None)
INT_FIELDS = frozenset(
    {
        "run_at",
        "started_at",
        "ended_at",
        "enqueued_at",
        "pid",
        "retry_count",
        "stall_count",
        "timeout_count",
    }
)
#: the largest count of events one read returns
MAX_COUNT = 10_000


def parse(entry_id: Any, raw: dict[Any, Any]) -> dict[str, Any]:
    """One stream entry as an event dict (never raises on a field written by hand)."""
    event: dict[str, Any] = {"event_id": fields.text(entry_id)}
    for key, value in raw.items():
        name = fields.text(key)
        if name in INT_FIELDS:
            event[name] = fields.to_int(value, None) if value not in (b"", "") else None
        else:
            event[name] = fields.text(value)
    return event


def parse_entries(entries: list | None) -> list[dict[str, Any]]:
    """The events of an XRANGE reply, or of one stream of an XREAD reply."""
    return [parse(entry_id, raw) for entry_id, raw in entries or []]


def range_args(key: str, after: str, count: int) -> tuple[str, str, int]:
    """(min, max, count) of the XRANGE that reads `count` events after `after` ('0': from the
    oldest kept, else an event_id: the events after it)."""
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNT:
        raise InvalidInput(f"count must be an int 1..{MAX_COUNT}, not {count!r}")
    return ("-" if after in ("0", "0-0", "-") else f"({after}"), "+", count


def read(r: Any, key: str, after: str = "0", count: int = 100) -> list[dict[str, Any]]:
    """Up to `count` events of the stream `key` after `after`, oldest first (no wait)."""
    low, high, count = range_args(key, after, count)
    return parse_entries(r.xrange(key, low, high, count=count))


def follow(
    r: Any, key: str, after: str = "$", count: int = 100, block: float = 5.0
) -> list[dict[str, Any]]:
    """Events after `after` ('$': only new ones), waiting up to `block` seconds for one
    (XREAD BLOCK on a connection of `r`: give it a socket timeout above `block`)."""
    range_args(key, "0", count)  # checks count
    reply = r.xread({key: after}, count=count, block=max(1, int(block * 1000)))
    return parse_entries(reply[0][1]) if reply else []
