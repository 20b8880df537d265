"""A SparkSession for the `queasy history` commands: `local[*]` by default, any master and
configuration given, so the same command runs on a cluster."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from . import register

#: settings for a local master (one machine, offline); any --conf overrides them
LOCAL = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
}
#: settings for every master: report times in UTC (the archive's dates are UTC dates)
ALWAYS = {"spark.sql.session.timeZone": "UTC"}


def session(
    master: str = "local[*]", conf: Mapping[str, str] | None = None, app: str = "queasy"
) -> tuple[SparkSession, bool]:
    """A session on `master` with `conf`, the queasy data sources registered, and whether it
    is new (the caller stops it). An active session of this process (a notebook's, a test's)
    is used as it is: `master` and `conf` apply to a new one only."""
    active = SparkSession.getActiveSession()
    if active is not None:
        register(active)
        return active, False
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = {**ALWAYS, **(LOCAL if master.startswith("local") else {}), **(conf or {})}
    builder = SparkSession.builder.master(master).appName(app)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark, True
