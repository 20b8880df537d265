"""The offsets of the `queasy-events` source: a place in a queue's event stream (Position:
after entry `id`, whose ordinal is `n`), the JSON of startingOffsets and endingOffsets
parsed into them, and their checks: a range does not end before it starts, names only streams
of the read, and does not start or end past the end of a stream."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput
from ..history import StreamEnd, entry_id


@dataclass(frozen=True)
class Position:
    """A place in a stream: after entry `id`, whose ordinal is `n`."""

    id: str
    n: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "n": self.n}

    @classmethod
    def from_json(cls, ref: str, value: Any) -> Position:
        if (
            not isinstance(value, Mapping)
            or not isinstance(value.get("id"), str)
            or not _entry_id(value["id"])
            or type(value.get("n")) is not int  # not a bool
            or value["n"] < 0
        ):
            raise InvalidInput(
                f"offset of {ref!r} must be {{'id': 'ms-seq', 'n': int}}, not {value!r}"
            )
        return cls(value["id"], value["n"])


START = Position("0-0", 0)


def _entry_id(text: str) -> bool:
    """A stream entry id as XRANGE takes it (else every task of the read failed on the
    server's error)."""
    try:
        entry_id(text)
    except InvalidInput:
        return False
    return True


def offsets_from_json(text: str, what: str) -> dict[str, Position]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be 'earliest', 'latest' or a JSON object, not {text!r}")
    return {ref: Position.from_json(ref, v) for ref, v in value.items()}


def check_range(start: Mapping[str, Position], end: Mapping[str, Position]) -> None:
    """InvalidInput naming both offsets when a stream's endingOffsets is before its
    startingOffsets (a read took that for a stream made again and said events were
    trimmed)."""
    for ref, b in end.items():
        a = start.get(ref)
        if a is not None and (b.n < a.n or _order(b.id, end=True) < _order(a.id)):
            raise InvalidInput(
                f"the queasy-events source: endingOffsets of {ref!r} {b.to_json()} is before "
                f"its startingOffsets {a.to_json()}: the end of a range must not be before "
                "its start"
            )


#: the largest sequence number of a stream entry id
MAX_SEQ = 2**64 - 1


def _order(text: str, end: bool = False) -> tuple[int, int]:
    """A checked entry id ('ms-seq', or 'ms') as a pair that sorts as the stream does: 'ms'
    alone is its first entry as a start and its last as an `end` (as XRANGE takes them)."""
    ms, _, seq = text.partition("-")
    return int(ms), int(seq) if seq else (MAX_SEQ if end else 0)


def check_refs(offsets: Mapping[str, Position], refs: Collection[str], what: str) -> None:
    """InvalidInput when `offsets` names a stream the read does not read (`refs`): a typo
    was read as if not given (endingOffsets: the stream not read at all)."""
    unknown = sorted(set(offsets) - set(refs))
    if unknown:
        raise InvalidInput(
            f"the queasy-events source: {what} names {unknown[0]!r}, which is not a stream "
            f"of this read (its streams: {sorted(refs)}; a fail queue's is '{{q}}q-fail', "
            "read with failQueues=true)"
        )


def check_within(ref: str, at: Position, end: StreamEnd, what: str) -> None:
    """InvalidInput when `at` is past the end of the stream (the last id and count `end`):
    each task of a read failed saying that the events up to it were trimmed."""
    if what == "startingOffsets":  # a stream made again since has later ids (n from 0)
        past = end.added > 0 and _order(at.id) > _order(end.last_id)
    else:
        past = at.n > end.added or _order(at.id) > _order(end.last_id)
    if past:
        raise InvalidInput(
            f"the queasy-events source: {what} of {ref!r} {at.to_json()} is past the end of "
            f"its stream ({Position(end.last_id, end.added).to_json()}): an offset of another "
            "server, prefix or stream, or of a stream deleted since?"
        )
