"""The `queasy-events` source: the outcome-event streams of queues as a DataFrame.

    spark.read.format("queasy-events").option("queues", "emails").load()
    spark.readStream.format("queasy-events").load()     # every queue; Trigger.AvailableNow too

Offsets are JSON: per stream (`EventStream.ref`), the id of the last entry read and its
ordinal, the count of entries ever added to the stream up to it (queasy_py/store/events.py).
A range (start, end] must hold end.n - start.n entries; fewer means the oldest ones were
trimmed (events_maxlen) before they were read: an error naming the queue and the count, or,
with failOnDataLoss=false, a warning and the entries that are left.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from .. import defaults
from ..client import Client
from ..errors import InvalidInput, QueasyError
from ..history import EventStream, History, StreamEnd, stream_ref
from .eventrows import SCHEMA, to_batch
from .offsets import (
    START,
    Position,
    check_range,
    check_refs,
    check_within,
    offsets_from_json,
)
from .options import Options, resolve_url

log = logging.getLogger("queasy_py.spark")

EVENT_OPTIONS = {
    "url", "prefix", "queues", "failQueues", "failOnDataLoss", "startingOffsets",
    "endingOffsets", "maxEventsPerTrigger", "readChunk",
}  # fmt: skip

DISCOVERY_SECONDS = 30.0  # how long a stream reader reuses its SCAN for queues="*"


# ---------------------------------------------------------------- offsets and partitions


#: the most entries one XRANGE of a read asks for (readChunk)
MAX_CHUNK = 1_000_000


@dataclass(frozen=True)
class Partition(InputPartition):
    """The entries (start, end] of one stream."""

    queue: str
    tag: str
    key: str
    start: Position
    end: Position

    @property
    def stream(self) -> EventStream:
        return EventStream(self.queue, self.tag, self.key)


@dataclass(frozen=True)
class SourceConfig:
    """The checked options of one read, built on the driver and sent to every task."""

    url: str
    prefix: str
    queues: tuple[str, ...] | None  # None: every stream found
    fail_queues: bool
    fail_on_data_loss: bool
    starting: str  # 'earliest' | 'latest' | JSON
    ending: str  # 'latest' | JSON (batch reads)
    max_per_trigger: int | None
    chunk: int

    def __repr__(self) -> str:  # the URL may hold a password
        return f"<SourceConfig prefix={self.prefix!r} queues={self.queues!r}>"

    @classmethod
    def build(cls, options: Mapping[str, str]) -> SourceConfig:
        opts = Options(options, EVENT_OPTIONS, "the queasy-events source")
        queues = opts.get("queues", "*")
        names = None if queues == "*" else tuple(q.strip() for q in queues.split(",") if q.strip())
        given = opts.values.get("queues")
        if names == () or (given is not None and not given.strip(" ,")):
            # an empty option is an unset one elsewhere: here that read every queue
            raise InvalidInput(
                f"the queasy-events source: queues names no queue ({given!r}): give queue "
                "names, comma-separated, or '*' for every queue"
            )
        starting = opts.get("startingOffsets", "earliest")
        if starting not in ("earliest", "latest"):
            offsets_from_json(starting, "startingOffsets")
        ending = opts.get("endingOffsets", "latest")
        if ending != "latest":
            ends = offsets_from_json(ending, "endingOffsets")
            if starting not in ("earliest", "latest"):
                check_range(offsets_from_json(starting, "startingOffsets"), ends)
        if names is not None:  # the read's streams are known: offsets name only them
            fail_queues = bool(opts.boolean("failQueues", True))
            refs = [ref for name in names for ref in _refs(name, fail_queues)]
            for what, text in (("startingOffsets", starting), ("endingOffsets", ending)):
                if text not in ("earliest", "latest"):
                    check_refs(offsets_from_json(text, what), refs, what)
        chunk = opts.whole("readChunk", 10_000) or 10_000
        if chunk > MAX_CHUNK:
            raise InvalidInput(
                f"the queasy-events source: readChunk must be at most {MAX_CHUNK:,}, not {chunk}"
            )
        return cls(
            url=resolve_url(opts.get("url")),
            prefix=opts.get("prefix", defaults.PREFIX),
            queues=names,
            fail_queues=bool(opts.boolean("failQueues", True)),
            fail_on_data_loss=bool(opts.boolean("failOnDataLoss", True)),
            starting=starting,
            ending=ending,
            max_per_trigger=opts.whole("maxEventsPerTrigger", None),
            chunk=chunk,
        )

    def client(self) -> Client:
        return Client(self.url, workers=0, prefix=self.prefix)


def _refs(name: str, fail_queues: bool) -> tuple[str, ...]:
    """The offset names (EventStream.ref) of the streams of queue `name`."""
    fail = stream_ref(name + defaults.FAIL_QUEUE_SUFFIX, name)
    return (name, fail) if fail_queues else (name,)


class Reading:
    """The driver side of a read: the streams, where they end, where a read starts."""

    def __init__(self, config: SourceConfig) -> None:
        self.config = config
        self._client: Client | None = None
        self._streams: list[EventStream] = []
        self._found_at = -1e9

    @property
    def history(self) -> History:
        if self._client is None:
            self._client = self.config.client()
        return History(self._client)

    def streams(self) -> list[EventStream]:
        """The streams read; with queues="*" found again at most every DISCOVERY_SECONDS."""
        if time.monotonic() - self._found_at > DISCOVERY_SECONDS or not self._streams:
            self._streams = self.history.streams(self.config.queues, self.config.fail_queues)
            self._found_at = time.monotonic()
        return self._streams

    def start(self, stream: EventStream, end: StreamEnd) -> Position:
        """Where a new read of `stream` starts (startingOffsets; a stream its JSON does not
        name: earliest)."""
        starting = self.config.starting
        if starting == "latest":
            return Position(end.last_id, end.added)
        if starting != "earliest":
            given = offsets_from_json(starting, "startingOffsets").get(stream.ref)
            if given is not None:
                check_within(stream.ref, given, end, "startingOffsets")
                return given
        return Position("0-0", end.added - end.length)  # entries trimmed before: not lost

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def partitions(
    streams: Sequence[EventStream], start: Mapping[str, Position], end: Mapping[str, Position]
) -> list[Partition]:
    out = []
    for stream in streams:
        a, b = start.get(stream.ref, START), end.get(stream.ref)
        if b is not None and b != a:
            out.append(Partition(stream.queue, stream.tag, stream.key, a, b))
    return out


def read_partition(config: SourceConfig, part: InputPartition) -> Iterator[pa.RecordBatch]:
    """The entries (start, end] of one stream, checked against the count they must hold."""
    if not isinstance(part, Partition):
        return  # Spark's stand-in InputPartition(None) when there is no stream to read
    start = part.start
    if part.end.n < start.n:  # the stream was deleted and made again: count from its start
        start = Position(start.id, 0)
    expected = part.end.n - start.n
    got = 0
    with config.client() as client:
        history = History(client)
        for rows in history.read(part.stream, start.id, part.end.id, config.chunk):
            got += len(rows)
            yield to_batch(rows)
    if got < expected:
        lost = expected - got
        message = (
            f"{lost} outcome events of queue {part.queue!r} were trimmed from its stream before "
            f"they were read (after event {start.id}); the stream keeps the last events_maxlen "
            f"events (default {defaults.EVENTS_MAXLEN}): read more often, or raise "
            "events_maxlen"
        )
        if config.fail_on_data_loss:
            raise QueasyError(message + "; failOnDataLoss=false reads on without them")
        log.warning("%s; skipped (failOnDataLoss=false)", message)


# ---------------------------------------------------------------- batch


class EventsReader(DataSourceReader):
    def __init__(self, config: SourceConfig) -> None:
        self.config = config

    def partitions(self) -> Sequence[InputPartition]:
        reading = Reading(self.config)
        try:
            streams = reading.streams()
            ends = {s.ref: reading.history.end(s) for s in streams}
            start = {s.ref: reading.start(s, ends[s.ref]) for s in streams}
            end = {ref: Position(e.last_id, e.added) for ref, e in ends.items()}  # latest
            if self.config.ending != "latest":  # a stream its JSON does not name: latest
                given = offsets_from_json(self.config.ending, "endingOffsets")
                for ref, at in given.items():
                    if ref in ends:  # (queues=*: one not found has nothing to read)
                        check_within(ref, at, ends[ref], "endingOffsets")
                        end[ref] = at
            return partitions(streams, start, end)
        finally:
            reading.close()

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_partition(self.config, partition)


# ---------------------------------------------------------------- stream


class EventsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, config: SourceConfig) -> None:
        self.config = config
        self.reading = Reading(config)
        self.target: dict[str, Position] | None = None  # Trigger.AvailableNow's end

    def initialOffset(self) -> dict:
        return {
            s.ref: self.reading.start(s, self.reading.history.end(s)).to_json()
            for s in self.reading.streams()
        }

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.config.max_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {
            s.ref: self._end_of(self.reading.history.end(s)) for s in self.reading.streams()
        }

    @staticmethod
    def _end_of(end: StreamEnd) -> Position:
        return Position(end.last_id, end.added)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = {ref: Position.from_json(ref, v) for ref, v in start.items()}
        out = {ref: p.to_json() for ref, p in begin.items()}  # streams no longer found stay
        ranges = []
        for stream in self.reading.streams():
            at = begin.get(stream.ref, START)
            end = self._end_of(self.reading.history.end(stream))
            if self.target is not None:
                cap = self.target.get(stream.ref, at)
                if cap.n < end.n and cap.n >= at.n:
                    end = cap
            if end.n < at.n and self.config.fail_on_data_loss:
                raise QueasyError(
                    f"the outcome-event stream of queue {stream.queue!r} was deleted and made "
                    f"again: events after {at.id} may be lost; failOnDataLoss=false reads on"
                )
            ranges.append((stream, at, end, end.n - at.n if end.n >= at.n else end.n))
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        allotted = shares([pending for *_, pending in ranges], budget)
        for (stream, at, end, pending), share in zip(ranges, allotted, strict=True):
            if pending > share:
                end = self._advance(stream, at, share)
            out[stream.ref] = end.to_json()
        return out

    def _advance(self, stream: EventStream, at: Position, count: int) -> Position:
        """The position `count` entries after `at` (fewer when entries were trimmed)."""
        if count <= 0:
            return at
        end, ids = self.reading.history.head(stream, at.id, count)
        if not ids:
            return at
        # the entries after `at` start at ordinal max(at.n, oldest held - 1) + 1
        first = max(at.n, end.first_ordinal - 1) if end.added >= at.n else 0
        return Position(ids[-1], first + len(ids))

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = {ref: Position.from_json(ref, v) for ref, v in start.items()}
        until = {ref: Position.from_json(ref, v) for ref, v in end.items()}
        streams = {s.ref: s for s in self.reading.streams()}
        for ref in until:
            if ref not in streams:
                streams[ref] = stream_of_ref(ref, self.config.prefix, self.reading.history)
        return partitions(list(streams.values()), begin, until)

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_partition(self.config, partition)

    def commit(self, end: dict) -> None:
        pass  # nothing to release: the streams are capped by the library

    def stop(self) -> None:
        self.reading.close()


def shares(pending: Sequence[int], budget: int | None) -> list[int]:
    """The events each stream reads in a micro-batch of at most `budget` (None: no limit),
    in proportion to the events it has pending (Kafka's maxOffsetsPerTrigger): the first
    streams took the whole budget while they had that much, so a busy queue starved the
    others until their events were trimmed."""
    total = sum(pending)
    if budget is None or total <= budget:
        return list(pending)
    out = [budget * p // total for p in pending]
    # what rounding down left: one each to the largest remainders (so turn by turn)
    by_remainder = sorted(range(len(pending)), key=lambda i: -(budget * pending[i] % total))
    for i in by_remainder[: budget - sum(out)]:
        out[i] += 1
    return out


def stream_of_ref(ref: str, prefix: str, history: History) -> EventStream:
    """The stream of an offset's key: 'name' or '{tag}name'."""
    if ref.startswith("{") and "}" in ref:
        tag, name = ref[1:].split("}", 1)
        return history.stream(name, tag)
    return history.stream(ref)


class EventsSource(DataSource):
    """`spark.read.format("queasy-events")` and `spark.readStream.format(...)`."""

    @classmethod
    def name(cls) -> str:
        return "queasy-events"

    def schema(self) -> T.StructType:
        return SCHEMA

    def reader(self, schema: T.StructType) -> EventsReader:
        return EventsReader(self._config(schema))

    def streamReader(self, schema: T.StructType) -> EventsStreamReader:
        return EventsStreamReader(self._config(schema))

    def _config(self, schema: T.StructType) -> SourceConfig:
        if schema != SCHEMA:
            raise InvalidInput("the queasy-events source has a fixed schema: give none")
        return SourceConfig.build(self.options)
