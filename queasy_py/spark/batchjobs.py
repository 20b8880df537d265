"""The rows of an Arrow batch as the `queasy` sink's jobs: dispatch_batch's jobs, or the
encoded triples (id, data JSON, run_at ms) that encoded.dispatch_encoded_stream sends, and the
error of a refused row named by its id."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from .. import validate
from ..errors import InvalidInput
from ..queue_base import new_job_ids
from . import jsonmap

if TYPE_CHECKING:
    from .sink import SinkPlan


#: the characters of a refused row's id that its error shows
MAX_SHOWN_ID = 100


def row_error(exc: InvalidInput, jobs_of: BatchJobs, batch: pa.RecordBatch) -> str:
    """The message of `exc`, naming the row's id rather than its index in an Arrow batch."""
    text = str(exc)
    match = re.match(r"jobs\[(\d+)\]: ", text)
    if match is None:
        return text
    name = jobs_of.plan.id_column
    job_id = None if name is None else str(batch.column(name)[int(match[1])].as_py())
    if job_id is not None and len(job_id) > MAX_SHOWN_ID:  # a page of log per task else
        job_id = f"{job_id[:MAX_SHOWN_ID]}... ({len(job_id)} characters)"
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
        try:
            values = batch.column(name).to_pylist()
        except (OverflowError, ValueError) as exc:  # a Spark time Python's datetime cannot hold
            raise InvalidInput(
                f"column {name!r} holds a date or timestamp outside the years 1-9999 in UTC "
                f"({exc}), which queasy cannot write as ISO 8601: filter it or cast the column "
                "to string or long first"
            ) from None
        conv = self.convert[name]
        return values if conv is None else [conv(v) for v in values]

    def data(self, batch: pa.RecordBatch) -> list[Any]:
        """Each row's job data: the data column's value, or an object of the data columns."""
        if self.plan.data_column:
            return self.values(batch, self.plan.data_column)
        names = self.plan.data_columns or tuple(self.types)
        lists = [self.values(batch, name) for name in names]
        return [dict(zip(names, row, strict=True)) for row in zip(*lists, strict=True)]

    def __call__(self, batch: pa.RecordBatch) -> list[dict[str, Any]]:
        plan = self.plan
        data = self.data(batch)
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
        data = self.data(batch)
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
            given = self.run_ats(batch)
            try:
                run_ats = ["" if r is None else validate.run_at_ms(r, None, now) for r in given]
            except InvalidInput:  # which row (as dispatch_batch names it)
                for index, run_at in enumerate(given):
                    try:
                        validate.run_at_ms(run_at, None, now)
                    except InvalidInput as exc:
                        raise InvalidInput(f"jobs[{index}]: {exc}") from None
                raise
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
