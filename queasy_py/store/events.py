"""The outcome-event streams, read (the store's one reader of them).

An event as the operator calls read it (`typed`, `page`, `follow`) is a dict: `event_id`
(the stream entry id, the cursor to read on from), the text fields `id, queue, outcome,
client, error_name, error_kind, error_message, traceback`, and the integer fields `run_at,
started_at, ended_at, enqueued_at` (ms since the epoch), `pid, retry_count, stall_count,
timeout_count` (None where the library wrote '': unknown). README "Outcome events": the
schema, versioned with the library.

Each queue has a capped stream `<base>:events` (lua/queasy.lua, outcome_event). Since library
4.0.0 an entry holds one line (field `event`: outcome, id, the times, pid, counts and client,
'-' for unknown) and, for an outcome with an error, the four error fields; the queue is the
stream's. Entries written by 3.x hold the 16 fields of the schema each. `fields_of` turns
either into the schema's fields, so every reader returns what it did before. The library
only appends to it (XADD ... MAXLEN ~) and trimming only removes its oldest entries; nothing
deletes an entry in the middle. So the entries of a stream are numbered: the n-th entry ever
added has ordinal n, the stream holds ordinals `added - length + 1 ..= added`, and a reader
that remembers the ordinal it reached knows how many entries it has missed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput
from . import fields
from .lazyredis import redis

#: a stream key: <prefix>:{<tag>}:<queue name>:events (names hold no braces)
STREAM_KEY = re.compile(r"^(?P<prefix>.+?):\{(?P<tag>[^{}]+)\}:(?P<name>[^{}]+):events$")


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """Where a stream ends: its last entry id ('0-0' when none was ever added), the entries
    ever added, and the entries it holds."""

    last_id: str
    added: int
    length: int

    @property
    def first_ordinal(self) -> int:
        """The ordinal of the oldest entry held (added + 1 when it holds none)."""
        return self.added - self.length + 1


EMPTY = StreamEnd("0-0", 0, 0)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _end(info: Any) -> StreamEnd:
    if isinstance(info, redis.ResponseError):
        if "no such key" in str(info).lower():
            return EMPTY
        raise info
    return StreamEnd(
        _text(info["last-generated-id"]), int(info["entries-added"]), int(info["length"])
    )


def stream_end(r: redis.Redis, key: str) -> StreamEnd:
    """The end of the stream `key` (EMPTY when it does not exist)."""
    with r.pipeline(transaction=False) as pipe:
        pipe.xinfo_stream(key)
        return _end(pipe.execute(raise_on_error=False)[0])


def head(r: redis.Redis, key: str, after: str, count: int) -> tuple[StreamEnd, list[str]]:
    """The stream's end and the ids of up to `count` entries after id `after`, read at the
    same instant (MULTI), so the ordinal of each id is known."""
    with r.pipeline(transaction=True) as pipe:
        pipe.xinfo_stream(key)
        pipe.xrange(key, f"({after}", "+", count=count)
        info, entries = pipe.execute(raise_on_error=False)
    end = _end(info)
    if isinstance(entries, Exception):
        return end, []
    return end, [_text(entry_id) for entry_id, _ in entries]


def entries(
    r: redis.Redis, key: str, after: str, until: str, chunk: int
) -> Iterator[list[tuple[str, dict[str, str]]]]:
    """The entries with ids in (after, until], `chunk` at a time, as the schema's fields
    (decoded, UTF-8: fields_of)."""
    queue = queue_of(key)
    while after != _LAST_ID:  # nothing follows it ('(' + it is an error)
        rows = r.xrange(key, f"({after}", until, count=chunk)
        if not rows:
            return
        yield [(_text(entry_id), fields_of(raw, queue)) for entry_id, raw in rows]
        if len(rows) < chunk:
            return
        after = _text(rows[-1][0])


def stream_keys(r: redis.Redis, prefix: str) -> list[tuple[str, str, str]]:
    """(key, tag, queue name) of every outcome-event stream under `prefix` (SCAN)."""
    found = []
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + ":{*}:*:events"
    for raw in r.scan_iter(match=pattern, count=1000, _type="stream"):
        key = _text(raw)
        match = STREAM_KEY.match(key)
        if match is not None and match["prefix"] == prefix:
            found.append((key, match["tag"], match["name"]))
    return sorted(found, key=lambda f: (f[1], f[2]))  # by tag, then name: a queue first


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
#: the words of an entry's `event` line (library 4.0.0), in order
LINE_FIELDS = (
    "outcome",
    "id",
    "ended_at",
    "started_at",
    "pid",
    "run_at",
    "enqueued_at",
    "retry_count",
    "stall_count",
    "timeout_count",
    "client",
)
#: an event line whose id holds spaces (a record written with raw commands: the library's id
#: rules forbid them): the outcome, the id (all up to the line's last 9 words), and the 8
#: numbers ('-': unknown) and client id (no space: the id rules) that end every line
_SPACED_ID = re.compile(r"^(\S+) (.+) ((?:(?:\d+|-) ){8}\S*)$")
#: the fields an entry holds only for an outcome with an error ('' when absent)
ERROR_FIELDS = ("error_name", "error_kind", "error_message", "traceback")


def queue_of(key: str) -> str:
    """The queue name of the stream `key` (<prefix>:{<tag>}:<name>:events); '' for another."""
    match = STREAM_KEY.match(key)
    return match["name"] if match is not None else ""


def fields_of(raw: dict[Any, Any], queue: str) -> dict[str, str]:
    """The schema's fields (README "Outcome events") of one stream entry as text: an entry of
    library 4.0.0 (an `event` line, error fields when any; `queue` is the stream's queue) or
    of 3.x (the fields themselves). Never raises on an entry written by hand."""
    out = {_text(k): _text(v) for k, v in raw.items()}
    line = out.pop("event", None)
    if line is None:
        return out  # an entry of library 3.x (or one written by hand): as it is
    words = line.split(" ")
    if len(words) > len(LINE_FIELDS):  # an id with spaces, written around the library
        match = _SPACED_ID.match(line)
        if match is not None:
            words = [match[1], match[2], *match[3].split(" ")]
    event = {"id": "", "queue": queue}
    for name, word in zip(LINE_FIELDS, words, strict=False):
        event[name] = "" if word == "-" else word
    for name in LINE_FIELDS:
        event.setdefault(name, "")
    for name in ERROR_FIELDS:
        event[name] = out.get(name, "")
    return event


#: the largest count of events one read returns
MAX_COUNT = 10_000
#: the longest XREAD BLOCK of a reader that waits for events, in seconds: below the socket
#: timeout of every producer connection (defaults.SOCKET_TIMEOUT, 5 s)
EVENT_BLOCK = 2.0


def typed(entry_id: Any, raw: dict[Any, Any], queue: str) -> dict[str, Any]:
    """One stream entry of the stream of `queue` as an event dict (never raises on a field
    written by hand)."""
    event: dict[str, Any] = {"event_id": fields.text(entry_id)}
    for name, value in fields_of(raw, queue).items():
        if name in INT_FIELDS:
            event[name] = fields.to_int(value, None) if value != "" else None
        else:
            event[name] = value
    return event


def parse_entries(entries: list | None, key: str) -> list[dict[str, Any]]:
    """The events of an XRANGE reply, or of one stream of an XREAD reply, of the stream
    `key`."""
    queue = queue_of(key)
    return [typed(entry_id, raw, queue) for entry_id, raw in entries or []]


#: a stream entry id: ms, or ms-seq (each a 64-bit unsigned int, checked by entry_id)
_ENTRY_ID = re.compile(r"(\d{1,20})(?:-(\d{1,20}))?")
_MAX_PART = 2**64 - 1
#: the largest entry id: no entry can come after it
_LAST_ID = f"{_MAX_PART}-{_MAX_PART}"


def entry_id(value: object, name: str = "after") -> str:
    """`value` when it is a stream entry id ('0', '<ms>' or '<ms>-<seq>'); else InvalidInput
    naming `name` (redis-py's ResponseError said only 'Invalid stream ID')."""
    match = _ENTRY_ID.fullmatch(value) if isinstance(value, str) else None
    if match is None or any(int(part or 0) > _MAX_PART for part in match.groups()):
        wanted = f"{name} must be an event id ('0', or the event_id of an event read)"
        raise InvalidInput(f"{wanted}, not {value!r}"[:200])
    return value  # type: ignore[return-value]


def range_args(key: str, after: str, count: int) -> tuple[str, str, int]:
    """(min, max, count) of the XRANGE that reads `count` events after `after` ('0': from the
    oldest kept, else an event_id: the events after it)."""
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNT:
        raise InvalidInput(f"count must be an int 1..{MAX_COUNT}, not {count!r}")
    if after == "-":
        return "-", "+", count
    if entry_id(after) in ("0", "0-0"):
        return "-", "+", count
    if after == _LAST_ID:  # nothing can follow it ('(' + it is an error): an empty range
        return "+", "-", count
    return f"({after}", "+", count


def page(r: Any, key: str, after: str = "0", count: int = 100) -> list[dict[str, Any]]:
    """Up to `count` events of the stream `key` after `after`, oldest first (no wait)."""
    low, high, count = range_args(key, after, count)
    return parse_entries(r.xrange(key, low, high, count=count), key)


def recent(r: Any, key: str, since_ms: int = 0, count: int = 100) -> list[dict[str, Any]]:
    """The newest `count` events of the stream `key` written at or after `since_ms` (ms since
    the epoch, the server's clock: an event id's time), oldest first: one bounded read from
    the stream's end (XREVRANGE), whatever the stream holds before them. since_ms 0: the
    newest `count` events."""
    range_args(key, "0", count)  # checks count
    if isinstance(since_ms, bool) or not isinstance(since_ms, int) or since_ms < 0:
        raise InvalidInput(f"since_ms must be an int >= 0, not {since_ms!r}")
    return parse_entries(r.xrevrange(key, "+", f"{since_ms}-0", count=count), key)[::-1]


def newest_id(reply: list | None) -> str:
    """The id of XREVRANGE key + - COUNT 1's entry, "0-0" when the stream is empty (or
    missing): where a reader of only what comes next starts (XREAD). XREVRANGE, not XINFO
    STREAM: the README's ACL line grants the one, not the other."""
    return _text(reply[0][0]) if reply else "0-0"


def last_id(r: Any, key: str) -> str:
    """newest_id of the stream `key`, read with `r` (synchronous)."""
    return newest_id(r.xrevrange(key, "+", "-", count=1))


def read_block(r: Any, seconds: float) -> float:
    """How long one XREAD BLOCK of `r` may wait: `seconds`, EVENT_BLOCK at most, and half the
    socket timeout of its connections (a URL's `?socket_timeout=` wins over SOCKET_TIMEOUT: a
    block above it fails with redis-py's bare TimeoutError)."""
    kwargs = getattr(r, "get_connection_kwargs", dict)()
    timeout = kwargs.get("socket_timeout") if isinstance(kwargs, dict) else None
    if isinstance(timeout, int | float) and timeout > 0:
        return min(seconds, EVENT_BLOCK, timeout / 2)
    return min(seconds, EVENT_BLOCK)


def follow(
    r: Any, key: str, after: str = "$", count: int = 100, block: float = 5.0
) -> list[dict[str, Any]]:
    """Events after `after` ('$': only new ones), waiting up to `block` seconds for one
    (XREAD BLOCK on a connection of `r`: give it a socket timeout above `block`)."""
    range_args(key, "0", count)  # checks count
    reply = r.xread({key: after}, count=count, block=max(1, int(block * 1000)))
    return read_entries(reply, key)


def read_entries(reply: Any, key: str) -> list[dict[str, Any]]:
    """parse_entries of an XREAD reply on the one stream `key`: RESP2's [[key, entries]], or
    a map {key: [entries]} on a `?protocol=3` connection (redis-py's RESP3 form)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        (rows,) = reply.values()
        return parse_entries(rows[0] if rows and isinstance(rows[0], list) else rows, key)
    return parse_entries(reply[0][1], key)
