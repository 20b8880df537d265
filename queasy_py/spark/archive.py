"""The event archive: the outcome events, exactly once, in Parquet partitioned by date and queue.

A streaming query from the `queasy-events` source into Spark's file sink with
Trigger.AvailableNow: each run reads what was added since the last one (its offsets are in
`<path>/_checkpoint`), writes it, and stops. The file sink commits each batch in
`<path>/_spark_metadata` after its files are written, and Spark's readers of `<path>` read only
committed files; a run killed mid-batch (even SIGKILL) leaves files no reader sees, and the
next run writes that batch again from the same offsets. So every event is in the archive once.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from .. import defaults, errors
from . import register

CHECKPOINT = "_checkpoint"


@dataclass(frozen=True)
class Archived:
    """What one archive run did."""

    batches: int
    events: int


def archive(
    spark: SparkSession,
    path: str,
    *,
    url: str | None = None,
    prefix: str = defaults.PREFIX,
    queues: list[str] | None = None,
    fail_queues: bool = True,
    fail_on_data_loss: bool = True,
    max_events_per_trigger: int | None = None,
) -> Archived:
    """Archive the events added since the last run into Parquet under `path` (any Hadoop path:
    a local directory, hdfs://, s3a://); returns the batches and events written."""
    register(spark)
    reader = spark.readStream.format("queasy-events").option("prefix", prefix)
    if url is not None:
        reader = reader.option("url", url)
    if queues is not None:
        reader = reader.option("queues", ",".join(queues))
    reader = reader.option("failQueues", str(fail_queues).lower())
    reader = reader.option("failOnDataLoss", str(fail_on_data_loss).lower())
    if max_events_per_trigger is not None:
        reader = reader.option("maxEventsPerTrigger", str(max_events_per_trigger))
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", path)
        .option("checkpointLocation", os.path.join(path, CHECKPOINT))
        .partitionBy("date", "queue")
        .trigger(availableNow=True)
        .queryName("queasy-history-archive")
        .start()
    )
    try:
        query.awaitTermination()
    except StreamingQueryException as exc:
        found = queasy_error(exc)
        if found is None:
            raise
        raise found from exc
    progress = [p for p in query.recentProgress if p.get("numInputRows") is not None]
    return Archived(
        batches=sum(1 for p in progress if p["numInputRows"] > 0),
        events=sum(int(p["numInputRows"]) for p in progress),
    )


def queasy_error(exc: Exception) -> errors.QueasyError | None:
    """The queasy error a streaming query failed on, of its class (ConnectionFailed, the
    data-loss QueasyError, ...), else None. Spark reports an error of the source, raised in a
    Python worker, as the text of its traceback within its own exception: `queasy history
    archive` ended with two tracebacks (exit 1) on a server down or events trimmed."""
    match = re.search(r"queasy_py\.errors\.(\w+): (.+)", str(exc))
    if match is None:
        return None
    kind = getattr(errors, match[1], None)
    if not (isinstance(kind, type) and issubclass(kind, errors.QueasyError)):
        kind = errors.QueasyError
    return kind(match[2].strip())
