"""queasy_py on Spark (the extra `queasy_py[spark]`): DataFrames dispatch jobs, and the job-event
history is read, archived and reported with PySpark (README, "Spark").

    import queasy_py.spark
    queasy_py.spark.register(spark)       # the `queasy` sink and the `queasy-events` source
    df.write.format("queasy").option("queue", "emails").option("id_column", "user_id") \\
        .mode("append").save()
    spark.read.format("queasy-events").option("queues", "emails").load()

`import queasy_py` never imports this package (nor pyspark).
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from .eventrows import SCHEMA as EVENTS_SCHEMA
from .events import EventsSource
from .sink import DispatchCounts, QueasySink, dispatch_dataframe

__all__ = [
    "EVENTS_SCHEMA",
    "DispatchCounts",
    "EventsSource",
    "QueasySink",
    "dispatch_dataframe",
    "register",
]


def register(spark: SparkSession) -> None:
    """Register the `queasy` sink and the `queasy-events` source on this session."""
    spark.dataSource.register(QueasySink)
    spark.dataSource.register(EventsSource)
