"""The rows of the `queasy-events` source: its fixed schema, and stream entries as Arrow.

Fields are read by name: a missing one is null, unknown ones go to `extra`, and a number
field written around the library (garbled, out of range) is null, so events of older and
newer libraries (and of other producers of the stream) read alike.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

#: the fixed schema of the source (README, "Spark": the events schema)
SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.StringType()),  # the stream entry id, 'ms-seq'
        T.StructField("queue", T.StringType()),
        T.StructField("id", T.StringType()),
        T.StructField("outcome", T.StringType()),
        T.StructField("enqueued_at", T.TimestampType()),
        T.StructField("run_at", T.TimestampType()),
        T.StructField("started_at", T.TimestampType()),
        T.StructField("ended_at", T.TimestampType()),
        T.StructField("wait_seconds", T.DoubleType()),  # started_at - run_at
        T.StructField("run_seconds", T.DoubleType()),  # ended_at - started_at
        T.StructField("retry_count", T.LongType()),
        T.StructField("stall_count", T.LongType()),
        T.StructField("timeout_count", T.LongType()),
        T.StructField("error_name", T.StringType()),
        T.StructField("error_kind", T.StringType()),
        T.StructField("error_message", T.StringType()),
        T.StructField("client", T.StringType()),
        T.StructField("host", T.StringType()),
        T.StructField("pid", T.LongType()),
        T.StructField("date", T.DateType()),  # the UTC date of ended_at
        T.StructField("extra", T.MapType(T.StringType(), T.StringType())),  # other fields
    ]
)
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
TEXT = ("queue", "id", "outcome", "error_name", "error_kind", "error_message", "client", "host")
TIMES = ("enqueued_at", "run_at", "started_at", "ended_at")
COUNTS = ("retry_count", "stall_count", "timeout_count", "pid")
KNOWN = {*TEXT, *TIMES, *COUNTS}
MAX_MS = 253_402_300_799_999


def _ms(text: str | None) -> int | None:
    """A time field: integer ms; '' or a garbled value (written around the library) is null."""
    if not text or not text.isdigit() or len(text) > 15:
        return None
    value = int(text)
    return value if value <= MAX_MS else None


def _count(text: str | None) -> int | None:
    if not text or not text.isdigit() or len(text) > 18:
        return None
    return int(text)


def to_batch(rows: list[tuple[str, dict[str, str]]]) -> pa.RecordBatch:
    """Stream entries as a record batch of SCHEMA; fields read by name, extra ones kept in
    `extra`, missing ones null (other producers of the stream may add or lack fields)."""
    cols: dict[str, list[Any]] = {name: [] for name in SCHEMA.fieldNames()}
    for entry_id, fields in rows:
        cols["event_id"].append(entry_id)
        for name in TEXT:
            cols[name].append(fields.get(name) or None)
        times = [_ms(fields.get(name)) for name in TIMES]
        for name, value in zip(TIMES, times, strict=True):
            cols[name].append(None if value is None else value * 1000)
        _, run_at, started, ended = times
        cols["wait_seconds"].append(
            None if started is None or run_at is None else (started - run_at) / 1000
        )
        cols["run_seconds"].append(
            None if started is None or ended is None else (ended - started) / 1000
        )
        for name in COUNTS:
            cols[name].append(_count(fields.get(name)))
        cols["date"].append(None if ended is None else ended // 86_400_000)
        extra = [(k, v) for k, v in fields.items() if k not in KNOWN]
        cols["extra"].append(extra or None)
    arrays = [pa.array(cols[f.name], type=f.type) for f in ARROW_SCHEMA]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
