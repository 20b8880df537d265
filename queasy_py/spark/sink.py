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
import sys
import tempfile
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from .. import defaults
from ..client import Client
from ..encoded import dispatch_encoded_stream
from ..errors import InvalidInput
from ..queue_base import BatchResult
from . import jsonmap
from .batchjobs import BatchJobs, row_error
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
        names = [f.name for f in schema.fields]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # the Arrow batches could not be made (Spark fails in every task)
            raise InvalidInput(
                f"the queasy sink: the DataFrame has duplicate column names {twice}: rename "
                "or drop them first (df.toDF(...), df.select(...))"
            )
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
                            f"queasy sink, queue {self.queue!r}: {row_error(exc, jobs_of, batch)}"
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
        if isinstance(data_columns, str):
            raise InvalidInput(
                f"data_columns is a list of column names, not a string: got {data_columns!r}"
            )
        for name in data_columns:
            if not isinstance(name, str) or "," in name:
                raise InvalidInput(
                    f"data_columns: {name!r} is not a column name the sink can take (a str "
                    "without commas: rename the column first)"
                )
        options["data_columns"] = ",".join(data_columns)
    SinkPlan.build(options, df.schema)  # clear errors here, before Spark plans anything
    df.sparkSession.dataSource.register(QueasySink)
    with tempfile.TemporaryDirectory(prefix="queasy-sink-") as tmp:
        counts_file = os.path.join(tmp, "counts.json")
        df.write.format("queasy").options(**options, counts_file=counts_file).mode("append").save()
        return DispatchCounts(**json.loads(Path(counts_file).read_text()))
