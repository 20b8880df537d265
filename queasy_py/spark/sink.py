"""The `queasy` sink: a DataFrame's rows dispatched as jobs, and dispatch_dataframe().

    queasy_py.spark.register(spark)
    df.write.format("queasy").option("queue", "emails").option("id_column", "user_id") \\
        .mode("append").save()

Each task dispatches its Arrow batches as Queue.dispatch_batch would (500 jobs per FCALL, the
FCALLs of a batch pipelined), through encoded.dispatch_encoded_stream: a batch's rows encoded
in one orjson.dumps, one batch in flight while the next is converted. With an id column the
batches go with a dedup window (queasy_dispatch_once), so a retried task, a speculative copy
or a re-run of the whole write never runs an id twice; without one every row is a new job and
a retried task's rows are dispatched again. The counts of the tasks that succeeded come back
to the driver as commit messages and are logged (logger `queasy_py.spark`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from .. import defaults, validate
from ..client import Client
from ..encoded import dispatch_encoded_stream
from ..errors import InvalidInput
from ..queue import BatchResult, new_job_ids
from . import jsonmap
from .options import Options, resolve_url

log = logging.getLogger("queasy_py.spark")

SINK_OPTIONS = {
    "url", "prefix", "queue", "id_column", "run_at_column", "data_columns", "data_column",
    "update_data", "update_run_at", "reset_counts", "dedup_window", "counts_file",
}  # fmt: skip
COUNTS = ("rows", "created", "updated", "blocked", "skipped")


@dataclass
class DispatchCounts(WriterCommitMessage):
    """What a write dispatched: rows sent, and jobs created, updated, blocked, skipped."""

    rows: int = 0
    created: int = 0
    updated: int = 0
    blocked: int = 0
    skipped: int = 0

    def add(self, other: DispatchCounts | BatchResult, rows: int = 0) -> None:
        self.rows += getattr(other, "rows", rows)
        self.created += other.created
        self.updated += other.updated
        self.blocked += other.blocked
        self.skipped += other.skipped

    def __str__(self) -> str:
        return (
            f"{self.rows} rows: {self.created} created, {self.updated} updated, "
            f"{self.blocked} blocked, {self.skipped} skipped"
        )


@dataclass(frozen=True)
class SinkPlan:
    """The checked options of one write, built on the driver and sent to every task."""

    queue: str
    prefix: str
    schema_json: str
    id_column: str | None = None
    run_at_column: str | None = None
    data_columns: tuple[str, ...] | None = None
    data_column: str | None = None
    update_data: bool = True
    update_run_at: bool | str = True
    reset_counts: bool | None = None
    dedup_window: float | None = None
    counts_file: str | None = None
    url: str = field(default="", repr=False)  # may hold a password: never shown

    @classmethod
    def build(cls, options: Mapping[str, str], schema: T.StructType) -> SinkPlan:
        opts = Options(options, SINK_OPTIONS, "the queasy sink")
        columns = {f.name: f.dataType for f in schema.fields}
        queue = opts.required("queue")
        id_column = opts.column("id_column", columns)
        run_at_column = opts.column("run_at_column", columns)
        data_column = opts.column("data_column", columns)
        data_columns = opts.columns("data_columns", columns)
        if data_column is not None and data_columns is not None:
            raise InvalidInput("give the queasy sink data_columns or data_column, not both")
        if id_column is not None and not isinstance(
            columns[id_column], (T.StringType, *jsonmap.INTEGRAL)
        ):
            raise InvalidInput(
                f"id_column {id_column!r} has type {columns[id_column].simpleString()}: "
                "job ids are string or integral columns"
            )
        if run_at_column is not None and not isinstance(
            columns[run_at_column], (T.TimestampType, T.DateType, T.NumericType)
        ):
            raise InvalidInput(
                f"run_at_column {run_at_column!r} has type "
                f"{columns[run_at_column].simpleString()}: give a timestamp, a date or "
                "epoch seconds"
            )
        for name in (data_column,) if data_column else data_columns or tuple(columns):
            jsonmap.converter(columns[name], name)  # InvalidInput naming the column
        window = opts.number("dedup_window", defaults.DEDUP_WINDOW)
        return cls(
            queue=queue,
            prefix=opts.get("prefix", defaults.PREFIX),
            schema_json=schema.json(),
            id_column=id_column,
            run_at_column=run_at_column,
            data_columns=data_columns,
            data_column=data_column,
            update_data=opts.boolean("update_data", True),
            update_run_at=opts.run_at_mode("update_run_at"),
            reset_counts=opts.boolean("reset_counts", None),
            dedup_window=window if id_column is not None and window > 0 else None,
            counts_file=opts.get("counts_file"),
            url=resolve_url(opts.get("url")),
        )

    def check(self) -> None:
        """On the driver: the server answers, the queue name is valid, the library is loaded."""
        with Client(self.url, workers=0, prefix=self.prefix) as client:
            client.queue(self.queue)

    def dispatch(self, batches: Iterator[pa.RecordBatch]) -> DispatchCounts:
        """Dispatch every row of `batches` (one task's share). Runs on the executors."""
        schema = T.StructType.fromJson(json.loads(self.schema_json))
        jobs_of = BatchJobs(self, schema)
        counts = DispatchCounts()
        rows: deque[int] = deque()  # of the batches sent whose replies are not read yet
        with Client(self.url, workers=0, prefix=self.prefix) as client:

            def encoded() -> Iterator[list[Any]]:
                for batch in batches:
                    if batch.num_rows == 0:
                        continue
                    try:
                        triples = jobs_of.triples(batch, client.max_payload)
                    except InvalidInput as exc:
                        raise InvalidInput(
                            f"queasy sink, queue {self.queue!r}: {_row(exc, jobs_of, batch)}"
                        ) from None
                    rows.append(batch.num_rows)
                    yield triples

            try:
                # one batch in flight while the next is converted (encoded.dispatch_encoded_stream)
                for result in dispatch_encoded_stream(
                    client.queue(self.queue),
                    encoded(),
                    update_data=self.update_data,
                    update_run_at=self.update_run_at,
                    reset_counts=self.reset_counts,
                    dedup_window=self.dedup_window,
                ):
                    counts.add(result, rows.popleft())
            except InvalidInput as exc:
                if str(exc).startswith("queasy sink"):
                    raise
                raise InvalidInput(f"queasy sink, queue {self.queue!r}: {exc}") from None
        return counts


def _row(exc: InvalidInput, jobs_of: BatchJobs, batch: pa.RecordBatch) -> str:
    """The message of `exc`, naming the row's id rather than its index in an Arrow batch."""
    text = str(exc)
    match = re.match(r"jobs\[(\d+)\]: ", text)
    if match is None:
        return text
    name = jobs_of.plan.id_column
    job_id = None if name is None else str(batch.column(name)[int(match[1])].as_py())
    where = f"the row with id {job_id!r}" if job_id is not None else "a row"
    return f"{where}: {text[match.end() :]}"


class BatchJobs:
    """Turns an Arrow batch into dispatch_batch's jobs, column by column."""

    def __init__(self, plan: SinkPlan, schema: T.StructType) -> None:
        self.plan = plan
        self.types = {f.name: f.dataType for f in schema.fields}
        names = (plan.data_column,) if plan.data_column else plan.data_columns or tuple(self.types)
        self.convert = {name: jsonmap.column_converter(self.types[name], name) for name in names}

    def values(self, batch: pa.RecordBatch, name: str) -> list[Any]:
        values = batch.column(name).to_pylist()
        conv = self.convert[name]
        return values if conv is None else [conv(v) for v in values]

    def __call__(self, batch: pa.RecordBatch) -> list[dict[str, Any]]:
        plan = self.plan
        if plan.data_column:
            data = self.values(batch, plan.data_column)
        else:
            names = plan.data_columns or tuple(self.types)
            lists = [self.values(batch, name) for name in names]
            data = [dict(zip(names, row, strict=True)) for row in zip(*lists, strict=True)]
        if plan.id_column is None and plan.run_at_column is None:
            return [{"data": d} for d in data]
        ids = self.ids(batch) if plan.id_column else [None] * batch.num_rows
        run_ats = self.run_ats(batch) if plan.run_at_column else [None] * batch.num_rows
        return [
            {"data": d, "id": i, "run_at": r} for d, i, r in zip(data, ids, run_ats, strict=True)
        ]

    def triples(self, batch: pa.RecordBatch, max_bytes: int) -> list[Any]:
        """encoded.dispatch_encoded_stream's triples of `batch`: what dispatch_batch would send for
        self(batch), without its per-value checks of the data, which the column converters
        made on the way (JSON types only, finite floats, text keys). InvalidInput for a row
        (`jobs[i]: `, as dispatch_batch) whose id breaks the id rules, whose data is over
        `max_bytes` encoded or that JSON cannot encode."""
        plan = self.plan
        if plan.data_column:
            data = self.values(batch, plan.data_column)
        else:
            names = plan.data_columns or tuple(self.types)
            lists = [self.values(batch, name) for name in names]
            data = [dict(zip(names, row, strict=True)) for row in zip(*lists, strict=True)]
        try:
            encoded = None if plan.data_column else _split_objects(orjson.dumps(data), len(data))
            if encoded is None:
                encoded = [orjson.dumps(d) for d in data]
        except orjson.JSONEncodeError:  # (ints over 64 bits, nesting too deep): which row
            encoded = [_encode(d, max_bytes, i) for i, d in enumerate(data)]
        if max(map(len, encoded), default=0) > max_bytes:
            for index, value in enumerate(data):
                _encode(value, max_bytes, index)
        if plan.id_column:
            ids = self.ids(batch)
            plain = validate.PLAIN_ID.fullmatch
            for index, job_id in enumerate(ids):
                if not plain(job_id):
                    try:
                        validate.job_id(job_id)
                    except InvalidInput as exc:
                        raise InvalidInput(f"jobs[{index}]: {exc}") from None
        else:
            ids = new_job_ids(len(data))
        if plan.run_at_column:
            now = time.time()
            run_ats = [
                "" if r is None else validate.run_at_ms(r, None, now) for r in self.run_ats(batch)
            ]
        else:
            run_ats = [""] * len(data)
        return [v for triple in zip(ids, encoded, run_ats, strict=True) for v in triple]

    def ids(self, batch: pa.RecordBatch) -> list[str]:
        name = self.plan.id_column
        values = batch.column(name).to_pylist()
        if None in values:
            raise InvalidInput(f"id_column {name!r} is null in a row: every row needs an id")
        if isinstance(self.types[name], T.StringType):
            return values
        return [str(v) for v in values]

    def run_ats(self, batch: pa.RecordBatch) -> list[float | None]:
        """Epoch seconds (None: now) of the run_at column."""
        column = batch.column(self.plan.run_at_column)
        kind = column.type
        if pa.types.is_timestamp(kind):
            per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[kind.unit]
            ticks = pc.cast(column, pa.int64()).to_pylist()
            return [None if t is None else t / per_second for t in ticks]
        if pa.types.is_date32(kind):
            days = pc.cast(column, pa.int32()).to_pylist()
            return [None if d is None else d * 86400 for d in days]
        return [None if v is None else float(v) for v in column.to_pylist()]


def _split_objects(blob: bytes, count: int) -> list[bytes] | None:
    """The `count` JSON objects of `blob`, the JSON array of `count` objects, each encoded
    alone; None when `blob` holds '},{' elsewhere than between two of them (in a string, or
    between nested objects). One orjson.dumps of a batch costs a tenth of one per row (most of
    the latter is the allocation of each result). Sound because each boundary between two
    objects of the array is one '},{' (no match can overlap it), so any other adds a part."""
    parts = blob[2:-2].split(b"},{")
    if len(parts) != count:
        return None
    return [b"{%b}" % part for part in parts]


def _encode(data: Any, max_bytes: int, index: int) -> bytes:
    """validate.encode_data of the row at `index`, its error naming it as dispatch_batch's."""
    try:
        return validate.encode_data(data, max_bytes)
    except InvalidInput as exc:
        raise InvalidInput(f"jobs[{index}]: {exc}") from None


class QueasyWriter(DataSourceArrowWriter):
    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DispatchCounts:
        return self.plan.dispatch(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = DispatchCounts()
        for message in messages:
            if isinstance(message, DispatchCounts):
                total.add(message)
        announce(f"queasy sink: queue {self.plan.queue!r}: dispatched {total}")
        if self.plan.counts_file:
            # commit() runs on the driver's host: the driver program reads the file
            Path(self.plan.counts_file).write_text(json.dumps(asdict(total)))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        total = DispatchCounts()
        for message in messages:
            if isinstance(message, DispatchCounts):
                total.add(message)
        retry = (
            "writing it again skips the ids already dispatched"
            if self.plan.dedup_window
            else "without an id column, writing it again dispatches those rows again"
        )
        announce(
            f"queasy sink: the write to queue {self.plan.queue!r} failed; the tasks that "
            f"finished dispatched {total}; {retry}",
            logging.WARNING,
        )


class QueasySink(DataSource):
    """`df.write.format("queasy")`: see the module's docstring and the README."""

    @classmethod
    def name(cls) -> str:
        return "queasy"

    def writer(self, schema: T.StructType, overwrite: bool) -> QueasyWriter:
        if overwrite:
            raise InvalidInput("the queasy sink only appends jobs: use .mode('append')")
        plan = SinkPlan.build(self.options, schema)
        plan.check()
        return QueasyWriter(plan)


def announce(message: str, level: int = logging.INFO) -> None:
    """Log `message`; in a Spark Python worker with no logging set up, print it to stderr
    (Spark shows a worker's stderr in the driver's console for local masters)."""
    if logging.getLogger().handlers or log.handlers:
        log.log(level, message)
    else:
        print(message, file=sys.stderr, flush=True)


def dispatch_dataframe(
    df: DataFrame,
    queue: str,
    *,
    id_column: str | None = None,
    run_at_column: str | None = None,
    data_columns: list[str] | None = None,
    data_column: str | None = None,
    update_data: bool = True,
    update_run_at: bool | str = True,
    reset_counts: bool | None = None,
    dedup_window: float = defaults.DEDUP_WINDOW,
    url: str | None = None,
    prefix: str = defaults.PREFIX,
) -> DispatchCounts:
    """Dispatch the rows of `df` as jobs of `queue` through the `queasy` sink (registered on
    the DataFrame's session if it is not yet) and return the counts of its tasks that
    succeeded: a retried task counts once, the rows its failed attempt dispatched as updated
    or skipped. Every option is checked before any row is dispatched."""
    options = {"queue": queue, "prefix": prefix, "dedup_window": repr(float(dedup_window))}
    options.update(update_data=str(update_data), update_run_at=str(update_run_at))
    if reset_counts is not None:
        options["reset_counts"] = str(reset_counts)
    for key, value in (
        ("id_column", id_column),
        ("run_at_column", run_at_column),
        ("data_column", data_column),
        ("url", url),
    ):
        if value is not None:
            options[key] = value
    if data_columns is not None:
        options["data_columns"] = ",".join(data_columns)
    SinkPlan.build(options, df.schema)  # clear errors here, before Spark plans anything
    df.sparkSession.dataSource.register(QueasySink)
    with tempfile.TemporaryDirectory(prefix="queasy-sink-") as tmp:
        counts_file = os.path.join(tmp, "counts.json")
        df.write.format("queasy").options(**options, counts_file=counts_file).mode("append").save()
        return DispatchCounts(**json.loads(Path(counts_file).read_text()))
