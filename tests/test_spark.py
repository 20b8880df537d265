"""The Spark pipeline (queasy_py.spark) on a real SparkSession (local[2,4]: 2 threads, a task
tried up to 4 times) against the test server: the sink, the events source, the archive and
the report. One session for the module (its JVM starts once); the archive's SIGKILL test
runs the `queasy history archive` command in a process of its own.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from lua_calls import KEEP, NOW, SCHEDULE_ID, Lua, live, schedule
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from runtime_helpers import ROOT, Runtime, queue_spec, wait_for

import queasy_py.spark as qs
from queasy_py import Client, InvalidInput
from queasy_py.cli import exitcodes
from queasy_py.cli.main import main
from queasy_py.spark.archive import archive
from queasy_py.spark.events import EventsStreamReader, SourceConfig
from queasy_py.spark.plots import figure_png
from queasy_py.spark.report import compute, html, summary
from queasy_py.store import events

#: a Spark job takes seconds on a loaded 2-core machine (a JVM and Python workers start)
pytestmark = pytest.mark.timeout(300)

T0 = 1_790_000_000_000  # ms: the clock of the hand-made histories (2026-09-21)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    # the Python workers import tests/spark_helpers.py by name, and this checkout's queasy_py
    paths = [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("queasy-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    qs.register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def client(redis_url: str, prefix: str) -> Iterator[Client]:
    with Client(redis_url, workers=0, prefix=prefix) as c:
        yield c


def sink(df: Any, url: str, prefix: str, queue: str, **options: str) -> Any:
    writer = df.write.format("queasy").option("url", url).option("prefix", prefix)
    return writer.option("queue", queue).options(**options).mode("append")


# ---------------------------------------------------------------- sink


ALL_TYPES = """
select cast(id as string) as uid,
       cast(id as tinyint) as b8, cast(id as smallint) as i16, cast(id as int) as i32,
       id * 10000000000 as i64, id = 1 as flag, cast(id as float) / 4 as f32,
       cast(id as double) / 3 as f64, cast(id as decimal(12, 3)) / 8 as dec,
       concat('name-', id) as text, date'2024-02-29' + cast(id as int) as day,
       timestamp'2026-01-02 03:04:05.123456' + make_interval(0, 0, 0, 0, 0, 0, id) as ts,
       timestamp_ntz'2026-01-02 03:04:05' as ts_ntz, cast(concat('b', id) as binary) as raw,
       array(date'2024-01-01', null) as days,
       named_struct('n', id, 'at', timestamp'2026-01-01 00:00:00', 'tags', array('a', 'b'),
                    'm', map('k', cast(id as decimal(4, 1)))) as nested,
       map(cast(id as int), 'v') as by_int, cast(null as string) as nothing,
       timestamp'2030-01-01 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, id) as due
from range(3)
"""


def expected_data(n: int) -> dict[str, Any]:
    return {
        "uid": str(n),
        "b8": n,
        "i16": n,
        "i32": n,
        "i64": n * 10_000_000_000,
        "flag": n == 1,
        "f32": n / 4,
        "f64": n / 3,
        "dec": ["0.000000", "0.125000", "0.250000"][n],
        "text": f"name-{n}",
        "day": ["2024-02-29", "2024-03-01", "2024-03-02"][n],
        "ts": f"2026-01-02T03:04:0{5 + n}.123456Z",
        "ts_ntz": "2026-01-02T03:04:05.000000",
        "raw": base64.b64encode(f"b{n}".encode()).decode(),
        "days": ["2024-01-01", None],
        "nested": {
            "n": n,
            "at": "2026-01-01T00:00:00.000000Z",
            "tags": ["a", "b"],
            "m": {"k": f"{n}.0"},
        },
        "by_int": {str(n): "v"},
        "nothing": None,
        "due": f"2030-01-01T00:00:0{n}.000000Z",
    }


def test_sink_round_trip_maps_every_type(
    spark: SparkSession, redis_url: str, prefix: str, client: Client
) -> None:
    df = spark.sql(ALL_TYPES).repartition(2)
    sink(df, redis_url, prefix, "typed", id_column="uid", run_at_column="due").save()
    q = client.queue("typed")
    assert live(q.counts()) == {"waiting": 0, "delayed": 3, "blocked": 0, "active": 0}
    for n in range(3):
        job = q.get_job(str(n))
        assert job is not None and job.state == "delayed"
        assert job.data == expected_data(n), n
        assert job.run_at == datetime(2030, 1, 1, 0, 0, n, tzinfo=UTC).timestamp()
    # the helper: one column as the data, the counts back on the driver; sent again, the
    # waiting jobs are updated, not doubled
    counts = qs.dispatch_dataframe(
        df, "typed", id_column="uid", data_column="nested", url=redis_url, prefix=prefix
    )
    assert (counts.rows, counts.created, counts.updated, counts.skipped) == (3, 0, 3, 0)
    assert q.get_job("2").data == expected_data(2)["nested"]
    counts = qs.dispatch_dataframe(
        df, "picked", data_columns=["i32", "day"], url=redis_url, prefix=prefix
    )
    assert (counts.rows, counts.created) == (3, 3)
    picked = client.queue("picked")
    ids = [m.decode() for m in client.redis.zrange(picked.keys.waiting, 0, -1)]
    datas = sorted((picked.get_job(i).data for i in ids), key=lambda d: d["i32"])
    assert datas == [{"i32": n, "day": expected_data(n)["day"]} for n in range(3)]


@pytest.mark.parametrize(
    ("select", "options", "message"),
    [
        ("select make_dt_interval(1) as wait, 1 as n", {}, "column 'wait' has type interval"),
        ("select cast(null as string) as k", {"id_column": "k"}, "'k' is null in a row"),
    ],
)
def test_the_sink_refuses_what_it_cannot_map_naming_the_column(
    spark: SparkSession,
    redis_url: str,
    prefix: str,
    client: Client,
    select: str,
    options: dict,
    message: str,
) -> None:
    """A type is refused on the driver, before any task; a value in its task."""
    with pytest.raises(Exception, match=message):
        sink(spark.sql(select), redis_url, prefix, "bad", **options).save()
    assert live(client.queue("bad").counts()) == {
        "waiting": 0,
        "delayed": 0,
        "blocked": 0,
        "active": 0,
    }


def test_a_value_json_cannot_hold_is_refused_naming_the_column(
    spark: SparkSession, redis_url: str
) -> None:
    import pyarrow as pa
    from pyspark.sql.types import _parse_datatype_string

    from queasy_py.spark.batchjobs import BatchJobs
    from queasy_py.spark.sink import SinkPlan

    schema = _parse_datatype_string("x double, y array<float>")
    plan = SinkPlan.build({"queue": "q", "url": redis_url}, schema)
    ok = pa.RecordBatch.from_pydict({"x": [1.5], "y": [[0.5]]})
    assert BatchJobs(plan, schema)(ok) == [{"data": {"x": 1.5, "y": [0.5]}}]
    for bad, column in (
        ({"x": [float("nan")], "y": [[]]}, "x"),
        ({"x": [0.0], "y": [[float("inf")]]}, r"y\[\]"),
    ):
        with pytest.raises(InvalidInput, match=f"column '{column}' holds (nan|inf)"):
            BatchJobs(plan, schema)(pa.RecordBatch.from_pydict(bad))


def test_a_decimal_is_fixed_point_text_at_every_scale(
    spark: SparkSession, redis_url: str, prefix: str, client: Client
) -> None:
    """README: a decimal is a string, exact, at its column's scale (`"12.300"`); a scale over
    6 made 0 '0E-7' and 1e-7 '1.0E-7' (Python's str of a Decimal), as values and map keys."""
    df = spark.sql(
        "select 'a' as k, cast(0 as decimal(20, 7)) as zero, "
        "cast(0.0000001 as decimal(20, 8)) as tiny, cast(-12.3 as decimal(38, 18)) as neg, "
        "map(cast(0 as decimal(20, 9)), 'x') as by_dec"
    )
    sink(df, redis_url, prefix, "dec", id_column="k").save()
    assert client.queue("dec").get_job("a").data == {
        "k": "a",
        "zero": "0.0000000",
        "tiny": "0.00000010",
        "neg": "-12.300000000000000000",
        "by_dec": {"0.000000000": "x"},
    }


def test_a_timestamp_before_year_1000_has_four_digits_of_year(
    spark: SparkSession, redis_url: str, prefix: str, client: Client
) -> None:
    """ISO 8601 has four digits of year: strftime('%Y') wrote year 999 as '999' (a column of
    0001-01-01 stand-ins for 'none' is common)."""
    df = spark.sql(
        "select 'a' as k, timestamp'0999-01-02 03:04:05.5' as ts, "
        "timestamp_ntz'0001-01-01 00:00:00' as ntz, array(timestamp'0050-06-07 08:09:10') as tss"
    )
    sink(df, redis_url, prefix, "old", id_column="k").save()
    assert client.queue("old").get_job("a").data == {
        "k": "a",
        "ts": "0999-01-02T03:04:05.500000Z",
        "ntz": "0001-01-01T00:00:00.000000",
        "tss": ["0050-06-07T08:09:10.000000Z"],
    }


def test_a_timestamp_out_of_years_1_to_9999_in_utc_is_refused_naming_the_column(
    spark: SparkSession, redis_url: str
) -> None:
    """Spark holds timestamps past the UTC years 1-9999 (timestamp'0001-01-01 00:00:00' in a
    session at Asia/Tokyo, '9999-12-31 23:59:59' at America/Los_Angeles) that no Python
    datetime holds: each task failed on pyarrow's bare OverflowError, naming nothing."""
    import pyarrow as pa
    from pyspark.sql.types import _parse_datatype_string

    from queasy_py.spark.batchjobs import BatchJobs
    from queasy_py.spark.sink import SinkPlan

    before_year_1 = -62_135_596_800_000_000 - 3_600_000_000  # µs: 0000-12-31T23:00Z
    after_9999 = 253_402_300_800_000_000 + 3_600_000_000  # 10000-01-01T01:00Z
    stamp = pa.timestamp("us", tz="UTC")
    for schema, column, values in (
        ("k string, ts timestamp", "ts", pa.array([0, before_year_1], stamp)),
        ("k string, ntz timestamp_ntz", "ntz", pa.array([after_9999, 0], pa.timestamp("us"))),
        (
            "k string, s struct<t: timestamp>",
            "s",
            pa.StructArray.from_arrays([pa.array([0, after_9999], stamp)], ["t"]),
        ),
    ):
        schema = _parse_datatype_string(schema)
        plan = SinkPlan.build({"queue": "q", "url": redis_url, "id_column": "k"}, schema)
        batch = pa.RecordBatch.from_arrays([pa.array(["a", "b"]), values], names=schema.names)
        with pytest.raises(InvalidInput, match=f"column '{column}' holds a date or timestamp"):
            BatchJobs(plan, schema).triples(batch, 1 << 20)


def test_the_sink_refuses_the_occurrence_id_of_a_scheduled_queue_before_any_chunk(
    spark: SparkSession, redis_url: str, prefix: str, r: redis.Redis
) -> None:
    """The id `schedule` is reserved in a queue with a schedule (library 4.3.0): dispatch_batch
    asks before it sends a batch of several chunks, so nothing of it is written; the sink's
    Arrow batch of 1,200 rows (3 chunks) was sent whole, and the library refused only the
    chunk holding the id: 1,000 jobs written by a write that failed."""
    lua = Lua(r, prefix, "sched")
    with Client(redis_url, workers=0, prefix=prefix) as c:
        c.queue("sched")  # the library loaded
    assert schedule(lua, None, NOW + 3_600_000).code == 2
    df = spark.sql(
        f"select if(id = 1100, '{SCHEDULE_ID}', concat('j', id)) as k, id as n from range(1200)"
    ).coalesce(1)
    for options in ({}, {"dedup_window": "0"}):
        with pytest.raises(Exception, match=f"id '{SCHEDULE_ID}' is reserved"):
            sink(df, redis_url, prefix, "sched", id_column="k", **options).save()
        assert sum(lua.counts().values()) == 1  # the occurrence only


def test_the_sinks_encoded_triples_are_dispatch_batchs_arguments(
    spark: SparkSession, redis_url: str
) -> None:
    """BatchJobs.triples (one orjson.dumps per batch, split) sends what dispatch_batch would
    send for the same rows, with strings holding '},{', quotes and backslashes and nested
    objects (where the split falls back to one dumps per row)."""
    import pyarrow as pa
    from pyspark.sql.types import _parse_datatype_string

    from queasy_py.queue_base import QueueBase
    from queasy_py.spark.batchjobs import BatchJobs
    from queasy_py.spark.sink import SinkPlan

    texts = ["plain", 'a},{"b":1}', "\\", "},{", '"},{"', "é\u2028"]
    n = len(texts)
    flat = pa.RecordBatch.from_pydict(
        {"k": [f"id-{i}" for i in range(n)], "t": texts, "n": list(range(n))}
    )
    nested = pa.RecordBatch.from_pydict(
        {"k": flat.column("k"), "s": [[{"x": i}, {"x": -i}] for i in range(n)]}
    )
    queue = QueueBase(Client(redis_url, workers=0), "q")
    for schema, batch in (
        ("k string, t string, n long", flat),
        ("k string, s array<struct<x: int>>", nested),
    ):
        schema = _parse_datatype_string(schema)
        for options in ({"id_column": "k"}, {"id_column": "k", "data_column": schema.names[1]}):
            plan = SinkPlan.build({"queue": "q", "url": redis_url, **options}, schema)
            jobs_of = BatchJobs(plan, schema)
            (sent,), _ = queue._dispatch_many_args(jobs_of(batch), True, True, None)
            assert jobs_of.triples(batch, 1 << 20) == sent[5:]
    # without an id column, new ids of 32 hex digits, all different
    plan = SinkPlan.build({"queue": "q", "url": redis_url}, _parse_datatype_string("t string"))
    triples = BatchJobs(plan, _parse_datatype_string("t string")).triples(flat, 1 << 20)
    ids = triples[0::3]
    assert len(set(ids)) == n and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert triples[1::3] == [
        json.dumps({"t": t}, separators=(",", ":"), ensure_ascii=False).encode() for t in texts
    ]


def test_the_sink_names_the_row_whose_id_or_data_is_refused(
    spark: SparkSession, redis_url: str
) -> None:
    import pyarrow as pa
    from pyspark.sql.types import _parse_datatype_string

    from queasy_py.spark.batchjobs import BatchJobs, row_error
    from queasy_py.spark.sink import SinkPlan

    schema = _parse_datatype_string("k string, t string")
    plan = SinkPlan.build({"queue": "q", "url": redis_url, "id_column": "k"}, schema)
    jobs_of = BatchJobs(plan, schema)
    for rows, max_bytes, message in (
        (
            {"k": ["a", "b c"], "t": ["x", "y"]},
            100,
            "the row with id 'b c': job id 'b c' contains whitespace",
        ),
        (
            {"k": ["a", "b"], "t": ["x", "y" * 200]},
            100,
            "the row with id 'b': job data is 216 bytes encoded, over the limit of 100",
        ),
        (  # a long id is shown cut: its whole text made every task's error a page long
            {"k": ["a", "x" * 5000], "t": ["x", "y"]},
            1 << 20,
            f"the row with id '{'x' * 100}... (5000 characters)': job id must be 1-256",
        ),
    ):
        batch = pa.RecordBatch.from_pydict(rows)
        with pytest.raises(InvalidInput) as caught:
            jobs_of.triples(batch, max_bytes)
        assert row_error(caught.value, jobs_of, batch).startswith(message)
    # a run_at out of 1970..9999 (here before 1970) named no row
    schema = _parse_datatype_string("k string, due long")
    options = {"queue": "q", "url": redis_url, "id_column": "k", "run_at_column": "due"}
    jobs_of = BatchJobs(SinkPlan.build(options, schema), schema)
    batch = pa.RecordBatch.from_pydict({"k": ["a", "b"], "due": [0, -1]})
    with pytest.raises(InvalidInput) as caught:
        jobs_of.triples(batch, 1 << 20)
    assert row_error(caught.value, jobs_of, batch).startswith("the row with id 'b': run_at must")


@pytest.mark.parametrize(
    ("schema", "options", "message"),
    [
        ("deep struct<x: map<double, int>>", {}, "column 'deep.x' is a map with double keys"),
        ("v variant", {}, "column 'v' has type variant"),
        ("a array<time(6)>", {}, r"column 'a\[\]' has type time"),
        ("n int", {"id_column": "user"}, "id_column 'user' is not a column"),
        ("n int", {"id_colum": "n"}, "has no option 'id_colum'"),
        ("n double", {"id_column": "n"}, "job ids are string or integral columns"),
        ("n int", {"run_at_column": "n", "data_columns": "n,m"}, "names 'm', which is not"),
        ("n string", {"run_at_column": "n"}, "give a timestamp, a date or epoch seconds"),
        ("n int", {"update_run_at": "later"}, "must be true, false, if_later or if_earlier"),
        ("n int", {"dedup_window": "-1"}, "dedup_window must be a number >= 0"),
        ("n int", {"queue": ""}, "needs the option 'queue'"),
        ("a int, b int, a string", {}, r"duplicate column names \['a'\]"),
    ],
)
def test_sink_options_and_types_are_checked_first(
    spark: SparkSession, redis_url: str, schema: str, options: dict, message: str
) -> None:
    from pyspark.sql.types import _parse_datatype_string

    from queasy_py.spark.sink import SinkPlan

    given = {"queue": "q", "url": redis_url, **options}
    with pytest.raises(InvalidInput, match=message):
        SinkPlan.build(given, _parse_datatype_string(schema))


def test_the_sink_only_appends(spark: SparkSession, redis_url: str, prefix: str) -> None:
    with pytest.raises(Exception, match="only appends"):
        sink(spark.sql("select 1 as n"), redis_url, prefix, "q").mode("overwrite").save()


@pytest.fixture
def rt(redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(redis_url, prefix, r, tmp_path) as runtime:
        yield runtime


def test_retried_tasks_and_reruns_run_each_id_once(
    spark: SparkSession, redis_url: str, prefix: str, rt: Runtime, r: redis.Redis
) -> None:
    """Each of 2 tasks dispatches its first 250 rows (Arrow batches of 50), then fails once on
    a value; its retry waits until a job it sent is running (gated) and another finished,
    then sends every row again. Every id runs once, and so it does when the whole write runs
    again."""
    from spark_helpers import fail_once

    # a loaded machine (a JVM, its Python workers) must not make the supervisor miss its
    # heartbeats: a swept supervisor's jobs run again (stall_count + 1), not what this tests
    rt.start({"jobs": queue_spec(size=5)}, workers=1, heartbeat_interval=5.0)
    waits = {p: (f"u{p * 300 + 5}", f"u{p * 300 + 10}") for p in (0, 1)}
    udf = F.udf(fail_once(redis_url, prefix, 250, waits), "double", useArrow=False)
    rows = spark.range(0, 600, 1, 2).select(
        F.concat(F.lit("u"), "id").alias("uid"),
        udf("id").alias("n"),
        F.lit("spark").alias("tag"),
        F.when(F.col("id") % 300 == 5, F.concat(F.lit("g"), "id")).alias("gate"),
        # the gate holds a job on its first run only; "times": 0 skips it (misbehave)
        F.when(F.col("id") % 300 == 5, 1).otherwise(0).alias("times"),
    )
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        sink(rows, redis_url, prefix, "jobs", id_column="uid").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert sorted(r.lrange(f"{prefix}:failed-attempts", 0, -1)) == ["0", "1"], "both retried"
    for gated, _ in waits.values():
        rt.open_gate(gated.replace("u", "g"))
    ended = wait_for(
        lambda: len(found := {x["id"] for x in rt.records("end")}) == 600 and found,
        timeout=60,
        what="600 jobs ended",
    )
    starts: dict[str, int] = {}
    for record in rt.records("start"):
        starts[record["id"]] = starts.get(record["id"], 0) + 1
    assert ended == {f"u{n}" for n in range(600)}
    assert {k: v for k, v in starts.items() if v != 1} == {}, "an id ran twice"
    q = rt.queue("jobs")
    assert live(q.counts()) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}
    # the whole write again (a re-run of the job): every id is skipped
    again = qs.dispatch_dataframe(
        spark.range(0, 600, 1, 2).select(F.concat(F.lit("u"), "id").alias("uid")),
        "jobs",
        id_column="uid",
        url=redis_url,
        prefix=prefix,
    )
    assert (again.rows, again.created, again.skipped) == (600, 0, 600)
    assert live(q.counts()) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}
    assert len(rt.records("start")) == 600


# ---------------------------------------------------------------- events source


def history(lua: Lua, n: int, t0: int = T0) -> None:
    """n jobs through dispatch, dequeue and an end each: finished, retried then finished,
    failed (into the fail queue, whose job then finishes) and cancelled, in turn."""
    for i in range(n):
        at = t0 + i * 1000
        job_id = f"j{i}"
        lua.add(job_id, data=json.dumps({"i": i}), run_at=at, now=at)
        if i % 4 == 3:
            assert lua.cancel(job_id, now=at + 1) == 1
            continue
        job = lua.dequeue("c1", limit=1, now=at + 10).jobs[0]
        if i % 4 == 1:
            lua.retry("c1", job, run_at=at + 20, now=at + 15)
            job = lua.dequeue("c1", limit=1, now=at + 20).jobs[0]
        if i % 4 == 2:
            lua.fail("c1", job, fail_id=f"f{i}", now=at + 30)
        else:
            lua.finish("c1", job, now=at + 40)


def xrange_rows(r: redis.Redis, lua: Lua) -> list[tuple]:
    out = []
    for key in (lua.B, lua.F):
        for entry_id, raw in r.xrange(key + ":events"):
            f = events.fields_of(raw, events.queue_of(key + ":events"))
            out.append((entry_id, f["queue"], f["id"], f["outcome"], int(f["ended_at"]),
                        f["error_name"] or None))  # fmt: skip
    return sorted(out)


def frame_rows(rows: list[Any]) -> list[tuple]:
    return sorted(
        (
            row["event_id"],
            row["queue"],
            row["id"],
            row["outcome"],
            round(row["ended_at"].replace(tzinfo=UTC).timestamp() * 1000),
            row["error_name"],
        )  # fmt: skip
        for row in rows
    )


def events_reader(spark: SparkSession, url: str, prefix: str, stream: bool = False) -> Any:
    reader = spark.readStream if stream else spark.read
    return reader.format("queasy-events").option("url", url).option("prefix", prefix)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffsets": "{not json"}, "must be 'earliest', 'latest' or a JSON object"),
        ({"startingOffsets": '{"t": {"id": "0-0", "n": -5}}'}, "offset of 't' must be"),
        # these reached every task, which failed on the server's error (XRANGE's id, COUNT)
        ({"startingOffsets": '{"t": {"id": "zzz", "n": 0}}'}, "offset of 't' must be"),
        ({"endingOffsets": '{"t": {"id": "18446744073709551616-0", "n": 1}}'}, "of 't' must"),
        ({"startingOffsets": '{"t": {"id": "1-0", "n": true}}'}, "offset of 't' must be"),
        ({"readChunk": "99999999999999999999"}, "readChunk must be at most 1,000,000"),
        ({"readChunk": "0"}, "readChunk must be a whole number >= 1"),
        # read as every queue before
        ({"queues": ""}, "queues names no queue"),
        ({"queues": " , "}, "queues names no queue"),
    ],
)
def test_event_source_options_are_checked_on_the_driver(
    redis_url: str, options: dict, message: str
) -> None:
    from queasy_py.spark.events import SourceConfig

    with pytest.raises(InvalidInput, match=message):
        SourceConfig.build({"url": redis_url, "queues": "t", **options})
    SourceConfig.build({"url": redis_url, "startingOffsets": '{"t": {"id": "5-1", "n": 2}}'})


def test_batch_and_stream_reads_match_xrange(
    spark: SparkSession, redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path, client: Client
) -> None:
    lua = Lua(r, prefix, "q")
    history(lua, 12)
    fail_queue = Lua(r, prefix, "q")
    fail_queue.B = lua.F  # its jobs (the fail jobs) run too
    for job in fail_queue.dequeue("c2", limit=10, now=T0 + 60_000).jobs:
        fail_queue.finish("c2", job, now=T0 + 61_000)
    expected = xrange_rows(r, lua)
    assert len(expected) == 12 + 3 + 3  # 12 ends, 3 retries, 3 fail jobs finished

    batch = events_reader(spark, redis_url, prefix).option("queues", "q").load().collect()
    assert frame_rows(batch) == expected
    one = next(row for row in batch if row["id"] == "j2")
    assert one["outcome"] == "failed" and one["error_kind"] == "permanent"
    assert one["run_at"] == datetime.fromtimestamp((T0 + 2000) / 1000, UTC).replace(tzinfo=None)
    assert one["run_seconds"] == 0.005 and one["wait_seconds"] == 0.025
    assert one["pid"] == 42 and one["client"] == "c1" and one["date"] == date(2026, 9, 21)
    assert one["host"] is None and one["error_message"] == "no such key"  # lua_calls.Lua.fail's
    assert one["extra"] == {"traceback": "Traceback ...\nKeyError: no such key\n"}

    # a stream, in batches of at most 5 events, Trigger.AvailableNow: reads to the end, stops
    def run_stream() -> list[Any]:
        got: list[Any] = []
        query = (
            events_reader(spark, redis_url, prefix, stream=True)
            .option("queues", "q")
            .option("maxEventsPerTrigger", "5")
            .load()
            .writeStream.foreachBatch(lambda df, _: got.extend(df.collect()))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        assert sizes and max(sizes) <= 5, sizes
        return got

    assert frame_rows(run_stream()) == expected
    history(lua, 4, t0=T0 + 100_000)  # more events: the next run reads those only
    new = xrange_rows(r, lua)
    assert frame_rows(run_stream()) == sorted(set(new) - set(expected))


def test_trimmed_events_are_detected(
    spark: SparkSession, redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path, client: Client
) -> None:
    lua = Lua(r, prefix, "t")
    history(lua, 4)

    def run(fail_on_loss: bool) -> list[Any]:
        got: list[Any] = []
        query = (
            events_reader(spark, redis_url, prefix, stream=True)
            .option("queues", "t")
            .option("failQueues", "false")
            .option("failOnDataLoss", str(fail_on_loss).lower())
            .load()
            .writeStream.foreachBatch(lambda df, _: got.extend(df.collect()))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(120)
        except Exception as exc:  # StreamingQueryException, its cause's text within
            raise AssertionError(str(exc)) from None
        return got

    assert len(run(True)) == 5  # 4 ends and a retry
    history(lua, 8, t0=T0 + 100_000)  # 10 more events ...
    r.xtrim(
        lua.B + ":events", maxlen=3, approximate=False
    )  # ... of which 7 are trimmed before the next read
    with pytest.raises(AssertionError, match=r"7 outcome events of queue 't' were trimmed"):
        run(True)
    kept = [event["id"] for event in lua.events()]
    assert sorted(row["id"] for row in run(False)) == sorted(kept)


# ---------------------------------------------------------------- archive


def archive_command(url: str, prefix: str, path: Path, log: Path) -> subprocess.Popen:
    with log.open("ab") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "queasy_py.cli",
                "--log-level",
                "WARNING",
                "history",
                "archive",
                "--path",
                str(path),
                "--redis",
                url,
                "--prefix",
                prefix,
                "--master",
                "local[2]",
                "--max-events-per-trigger",
                "30",
            ],  # fmt: skip
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def batch_ids(path: Path) -> set[int]:
    return {int(p.name) for p in path.glob("*") if p.name.isdigit()} if path.exists() else set()


def test_archive_killed_mid_batch_then_restarted_holds_every_event_once(
    spark: SparkSession, redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path, client: Client
) -> None:
    lua = Lua(r, prefix, "arc")
    history(lua, 80)  # 100 events: 4 batches of 30 at most
    expected = xrange_rows(r, lua)
    out, log = tmp_path / "archive", tmp_path / "archive.log"
    checkpoint = out / "_checkpoint"
    killed_in = None
    for _ in range(3):  # the kill must land inside a batch: after its offsets, before its commit
        proc = archive_command(redis_url, prefix, out, log)
        try:
            while proc.poll() is None and killed_in is None:
                pending = batch_ids(checkpoint / "offsets") - batch_ids(checkpoint / "commits")
                if pending and max(pending) >= 1:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
                    if max(pending) not in batch_ids(checkpoint / "commits"):
                        killed_in = max(pending)
                time.sleep(0.005)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if killed_in is not None:
            break
        assert proc.returncode in (0, -signal.SIGKILL), log.read_text()[-3000:]
    assert killed_in is not None, "never killed inside a batch"
    # the restart: another driver (this process's session) goes on from the checkpoint
    archive(spark, str(out), url=redis_url, prefix=prefix, max_events_per_trigger=30)
    assert killed_in in batch_ids(checkpoint / "commits")
    archived = spark.read.parquet(str(out)).collect()
    assert frame_rows(archived) == expected, "every event once"
    partitions = {p.name for p in out.glob("date=*")}
    assert partitions == {"date=2026-09-21"}
    # incremental: a later run (in this process) adds only the new events
    history(lua, 8, t0=T0 + 400_000)
    done = archive(spark, str(out), url=redis_url, prefix=prefix, queues=["arc"])
    assert done.events == len(xrange_rows(r, lua)) - len(expected)
    assert frame_rows(spark.read.parquet(str(out)).collect()) == xrange_rows(r, lua)


# ---------------------------------------------------------------- report


def test_report_numbers_match_a_hand_computation(
    spark: SparkSession,
    redis_url: str,
    prefix: str,
    r: redis.Redis,
    tmp_path: Path,
    client: Client,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Queue a: 4 finished jobs waiting 1, 2, 3, 4 s and running 10, 20, 30, 40 s; one
    retried (ValueError) then finished; one failed (KeyError). Queue b: one finished."""
    a, b = Lua(r, prefix, "ra"), Lua(r, prefix, "rb")

    def run(lua: Lua, id: str, at: int, wait: int, took: int, end: str = "finish") -> None:
        lua.add(id, run_at=at, now=at)
        job = lua.dequeue("c1", limit=1, now=at + wait).jobs[0]
        started, ended = at + wait, at + wait + took
        ends = [100, *KEEP, "h", 0]  # retention, host, notify (library 2.0)
        if end == "finish":
            args = [job.id, job.token, "7", started, ""]
            lua.call("queasy_finish", [lua.B], ended, "c1", *ends, *args)
        elif end == "retry":
            args = [job.id, job.token, ended + 1000, "retry", "7", started, "ValueError", "", ""]
            lua.call("queasy_retry", [lua.B], ended, "c1", 100, *args)
        else:
            args = [job.id, job.token, "", "", "7", started, "KeyError", "permanent", "", ""]
            lua.call("queasy_fail", [lua.B], ended, "c1", *ends, *args)

    for n in range(4):
        run(a, f"a{n}", T0 + n * 60_000, (n + 1) * 1000, (n + 1) * 10_000)
    run(a, "a4", T0 + 300_000, 500, 1000, "retry")
    lua_job = a.dequeue("c1", limit=1, now=T0 + 400_000).jobs[0]
    a.call("queasy_finish", [a.B], T0 + 400_100, "c1", 100, *KEEP, "h", 0, lua_job.id,
           lua_job.token, "7", T0 + 400_000, "")  # fmt: skip
    run(a, "a5", T0 + 500_000, 0, 2000, "fail")
    run(b, "b0", T0, 250, 750)

    path = str(tmp_path / "archive")
    archive(spark, path, url=redis_url, prefix=prefix, queues=["ra", "rb"])
    report = compute(spark, path, top=3)
    qa, qb = report.queues
    assert (qa.queue, qa.events, qb.queue, qb.events) == ("ra", 7, "rb", 1)
    assert qa.outcomes["finished"] == 5 and qa.outcomes["failed"] == 1
    assert qa.outcomes["retried"] == 1 and qb.outcomes["finished"] == 1
    assert qa.failure_rate == pytest.approx(1 / 6) and qb.failure_rate == 0.0
    # the attempts of ra: a0-a3; a4 (retried at T0+301.5 s, to run at T0+302.5 s, started at
    # T0+400 s: waited 97.5 s); a5
    waits = sorted([1, 2, 3, 4, 0.5, 97.5, 0])
    runs = sorted([10, 20, 30, 40, 1, 0.1, 2])
    assert qa.wait == pytest.approx(tuple(hand_percentiles(waits)))
    assert qa.run == pytest.approx(tuple(hand_percentiles(runs)))
    assert qb.wait == pytest.approx((0.25,) * 3) and qb.run == pytest.approx((0.75,) * 3)
    assert report.top_errors == [("ra", "KeyError", None, 1), ("ra", "ValueError", None, 1)]
    assert [(q, i, s) for q, i, _, s, _ in report.slowest] == [
        ("ra", "a3", 40.0), ("ra", "a2", 30.0), ("ra", "a1", 20.0),
    ]  # fmt: skip
    assert report.bucket == "minute"
    assert sum(n for _, n in report.throughput["ra"]) == 5
    text = summary(report)
    assert "ra" in text and "16.7%" in text and "KeyError" in text
    png = figure_png(report)
    assert png.startswith(b"\x89PNG")
    page = html(report, png)
    assert "data:image/png;base64," + base64.b64encode(png).decode()[:40] in page
    assert "<td>ra</td>" in page and "16.7%" in page
    # the command (this process's session is used, and left running)
    out = tmp_path / "report.html"
    assert main(["history", "report", "--path", path, "--out", str(out), "--top", "3"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("8 events in") and "16.7%" in printed
    assert "data:image/png;base64," in out.read_text()
    assert main(["history", "report", "--path", path, "--conf", "no-equals"]) == exitcodes.CONFIG


def test_a_report_of_no_archive_is_one_line_not_a_traceback(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """README (CLI conventions): errors are one line, never a traceback. A --path with no
    archive was Spark's AnalysisException and its traceback, exit 1."""
    missing = str(tmp_path / "no-archive")
    assert main(["history", "report", "--path", missing]) == exitcodes.CONFIG
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "no-archive" in line and "PATH_NOT_FOUND" in line and "\n" not in line


def test_a_report_of_an_archive_of_no_events_says_0_events(
    spark: SparkSession, redis_url: str, prefix: str, tmp_path: Path, capsys: Any
) -> None:
    """`archive` before any event writes an archive of no files; `report` of it was exit 2,
    'cannot read the archive ...: [UNABLE_TO_INFER_SCHEMA]', as if there were none."""
    path, out = str(tmp_path / "archive"), tmp_path / "report.html"
    base = ["--path", path, "--redis", redis_url, "--prefix", prefix]
    assert main(["history", "archive", *base, "--queue", "nothing"]) == exitcodes.OK
    capsys.readouterr()
    assert main(["history", "report", "--path", path, "--out", str(out)]) == exitcodes.OK
    assert capsys.readouterr().out.startswith(f"0 events in {path}\n")
    assert "<p>0 events in" in out.read_text()


def test_a_report_keeps_queue_names_that_look_like_numbers(
    spark: SparkSession, redis_url: str, prefix: str, client: Client, tmp_path: Path
) -> None:
    """The archive is partitioned by queue: read with an inferred schema, queues '007' and
    '1e3' came back as the numbers 7 and 1000 (and summary() failed on them: len())."""
    for name in ("007", "1e3"):
        client.queue(name).dispatch({"n": 1}, id="x")
        client.queue(name).cancel("x")
    path = str(tmp_path / "archive")
    assert archive(spark, path, url=redis_url, prefix=prefix, queues=["007", "1e3"]).events == 2
    report = compute(spark, path)
    assert [q.queue for q in report.queues] == ["007", "1e3"]
    assert "\n007 " in summary(report)


def test_an_archive_that_fails_is_one_line_and_its_exit_code(
    spark: SparkSession,
    redis_url: str,
    prefix: str,
    r: redis.Redis,
    client: Client,
    tmp_path: Path,
    caplog: Any,
) -> None:
    """README (CLI conventions): errors are one line, never a traceback. `queasy history
    archive` with the server down, or with events trimmed (no --skip-trimmed), ended with
    Spark's StreamingQueryException and two tracebacks, exit 1: the source's error is raised
    in a Spark Python worker and comes back as text. archive() raises it as queasy's error."""
    path = str(tmp_path / "archive")
    down = ["--path", path, "--redis", "redis://:s3cret@127.0.0.1:1/0"]
    assert main(["history", "archive", *down]) == exitcodes.CONNECT
    (line,) = [rec.getMessage() for rec in caplog.records if rec.levelname == "ERROR"]
    assert line.startswith("cannot connect to Redis at redis://:***@127.0.0.1:1/0 after")
    assert "s3cret" not in line and "\n" not in line
    caplog.clear()
    lua = Lua(r, prefix, "t")
    history(lua, 4)
    base = ["--path", path, "--redis", redis_url, "--prefix", prefix, "--queue", "t"]
    assert main(["history", "archive", *base]) == exitcodes.OK
    history(lua, 8, t0=T0 + 100_000)  # 10 more events, 7 trimmed before the next run
    r.xtrim(lua.B + ":events", maxlen=3, approximate=False)
    assert main(["history", "archive", *base]) == exitcodes.FAILURE
    (line,) = [rec.getMessage() for rec in caplog.records if rec.levelname == "ERROR"]
    assert line.startswith("7 outcome events of queue 't' were trimmed") and "\n" not in line
    assert main(["history", "archive", *base, "--skip-trimmed"]) == exitcodes.OK


def hand_percentiles(values: list[float]) -> list[float]:
    """p50, p95, p99, linear between the nearest ranks (numpy's default)."""
    out = []
    for q in (0.5, 0.95, 0.99):
        pos = q * (len(values) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(values) - 1)
        out.append(values[lo] + (values[hi] - values[lo]) * (pos - lo))
    return out


def test_import_queasy_py_does_not_import_spark() -> None:
    code = (
        "import sys, queasy_py, queasy_py.client, queasy_py.history, queasy_py.cli.main\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pyspark', 'pyarrow', 'matplotlib', 'py4j') or m.startswith('queasy_py.spark'))\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_bad_options_are_invalid_input_on_the_driver(spark: SparkSession, redis_url: str) -> None:
    with pytest.raises(InvalidInput, match="data_columns or data_column, not both"):
        qs.dispatch_dataframe(
            spark.sql("select 1 as n"), "q", data_columns=["n"], data_column="n", url=redis_url
        )
    # a string was joined letter by letter ("names '', which is not a column")
    with pytest.raises(InvalidInput, match="a list of column names, not a string: got 'n,m'"):
        qs.dispatch_dataframe(spark.sql("select 1 as n, 2 as m"), "q", data_columns="n,m")
    # a name with a comma was split into other columns: data from the wrong ones
    df = spark.sql("select 1 as a, 2 as b, 3 as `a,b`")
    with pytest.raises(InvalidInput, match="'a,b' is not a column name the sink can take"):
        qs.dispatch_dataframe(df, "q", data_columns=["a,b"], url=redis_url)


def test_an_ending_offset_of_a_millisecond_alone_ends_after_its_entries(
    spark: SparkSession, redis_url: str, prefix: str, r: redis.Redis, client: Client
) -> None:
    """An endingOffsets id of a millisecond alone ('1000') ends after every entry of that
    millisecond, as XRANGE reads it; the range check took it for '1000-0' and refused a
    start inside that millisecond ('1000-2') as after the end."""
    lua = Lua(r, prefix, "t")
    history(lua, 5)
    key = lua.B + ":events"
    fields = [f for _, f in r.xrange(key)]
    r.delete(key)
    for seq, f in enumerate(fields, start=1):  # every entry in one millisecond
        r.xadd(key, f, id=f"1000-{seq}")
    start = json.dumps({"t": {"id": "1000-2", "n": 2}})
    end = json.dumps({"t": {"id": "1000", "n": len(fields)}})
    read = events_reader(spark, redis_url, prefix).option("queues", "t")
    read = read.option("failQueues", "false").option("startingOffsets", start)
    rows = read.option("endingOffsets", end).load().collect()
    after = [f"1000-{seq}" for seq in range(3, len(fields) + 1)]
    assert len(after) >= 3 and sorted(row["event_id"] for row in rows) == after


def test_an_ending_offset_before_the_starting_one_is_refused_naming_both(
    spark: SparkSession, redis_url: str, prefix: str, r: redis.Redis, client: Client
) -> None:
    """endingOffsets before startingOffsets (a batch read): the read took the range as a
    stream deleted and made again, read nothing, and failed saying events were trimmed. It is
    an invalid range, refused on the driver naming both offsets (as Spark's Kafka source)."""
    lua = Lua(r, prefix, "t")
    history(lua, 12)
    ids = [entry_id for entry_id, _ in r.xrange(lua.B + ":events")]
    start = json.dumps({"t": {"id": ids[9], "n": 10}})
    end = json.dumps({"t": {"id": ids[3], "n": 4}})
    read = events_reader(spark, redis_url, prefix).option("queues", "t")
    read = read.option("failQueues", "false")
    with pytest.raises(Exception) as info:
        read.option("startingOffsets", start).option("endingOffsets", end).load().collect()
    message = str(info.value)
    assert "trimmed" not in message
    assert "endingOffsets of 't'" in message and "before its startingOffsets" in message
    assert ids[9] in message and ids[3] in message
    # the same offsets the right way round read the 6 events between them
    rows = read.option("startingOffsets", end).option("endingOffsets", start).load().collect()
    assert sorted(row["event_id"] for row in rows) == ids[4:10]


def test_offsets_past_a_streams_end_or_of_no_stream_of_the_read_are_refused(
    spark: SparkSession, redis_url: str, prefix: str, r: redis.Redis, client: Client
) -> None:
    """startingOffsets or endingOffsets past the end of a stream (an offset of another
    server or prefix) failed every task saying that events were trimmed; a name that is no
    stream of the read (a typo) was read as not given, and a stream endingOffsets did not
    name was not read at all, while one startingOffsets did not name started at ordinal 0
    (a trimmed stream: events 'trimmed before they were read')."""
    lua = Lua(r, prefix, "t")
    history(lua, 4)  # 5 events
    ids = [entry_id for entry_id, _ in r.xrange(lua.B + ":events")]
    future = {"id": "99999999999999-0", "n": 1000}

    def read() -> Any:  # a new one each time: option() changes a reader
        return events_reader(spark, redis_url, prefix).option("queues", "t")

    start = json.dumps({"{t}t-fail": {"id": "0-0", "n": 0}})
    for option in ("startingOffsets", "endingOffsets"):
        with pytest.raises(Exception) as info:
            read().option(option, json.dumps({"t": future})).load().collect()
        message = str(info.value)
        assert "trimmed" not in message
        assert f"{option} of 't' {future} is past the end of its stream" in message
        assert f"{{'id': '{ids[-1]}', 'n': 5}}" in message
        typo = {"url": redis_url, "queues": "t", option: json.dumps({"tt": future})}
        with pytest.raises(InvalidInput, match=f"{option} names 'tt', which is not a stream"):
            SourceConfig.build(typo)
        with pytest.raises(InvalidInput, match=r"names '\{t\}t-fail', which is not a stream"):
            SourceConfig.build({**typo, "failQueues": "false", option: start})
    # a stream the JSON leaves out: from its earliest event held, to its latest
    r.xtrim(lua.B + ":events", maxlen=3, approximate=False)
    rows = read().option("startingOffsets", start).option("endingOffsets", start).load().collect()
    assert sorted(row["event_id"] for row in rows) == ids[2:]


def test_max_events_per_trigger_is_shared_by_the_streams_in_proportion(
    redis_url: str, prefix: str, r: redis.Redis, client: Client
) -> None:
    """maxEventsPerTrigger went to the streams in turn: the first took the whole budget while
    it had that much, so a busy queue starved the others (until their events were trimmed,
    a data-loss failure). It is shared in proportion to the events pending, as Spark's Kafka
    source shares maxOffsetsPerTrigger."""
    history(Lua(r, prefix, "a"), 16)  # 20 events
    history(Lua(r, prefix, "b"), 4)  # 5 events
    options = {"url": redis_url, "prefix": prefix, "queues": "a,b", "failQueues": "false"}
    reader = EventsStreamReader(SourceConfig.build({**options, "maxEventsPerTrigger": "10"}))
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
    finally:
        reader.stop()
    assert {ref: end[ref]["n"] - start[ref]["n"] for ref in end} == {"a": 8, "b": 2}
