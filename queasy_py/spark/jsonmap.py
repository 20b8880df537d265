"""Spark types mapped to JSON, explicitly (README, "Spark": the sink's type table).

`converter(dtype, column)` is checked on the driver, from the DataFrame's schema, before any
task runs: a type it cannot map is InvalidInput naming the column. On the executors it turns
the Python values of an Arrow column (`to_pylist()`) into JSON values.

| Spark type | JSON |
|---|---|
| boolean, byte, short, int, long, string, varchar, char | as they are |
| float, double | number; NaN and infinities are refused (naming the column) |
| decimal | string, exact (`"12.30"`) |
| date | string `YYYY-MM-DD` |
| timestamp | string, UTC, ISO 8601 with microseconds: `2026-11-23T15:04:05.123456Z` |
| timestamp_ntz | string, ISO 8601 without a zone: `2026-11-23T15:04:05.123456` |
| binary | string, base64 |
| array | list |
| struct | object |
| map | object; keys of type string, integral, date or decimal (written as text) |
| null | null |
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from pyspark.sql import types as T

from ..errors import InvalidInput

Convert = Callable[[Any], Any]

PLAIN = (
    T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType,
    T.StringType, T.VarcharType, T.CharType, T.NullType,
)  # fmt: skip
INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
KEY_TYPES = (T.StringType, T.VarcharType, T.CharType, *INTEGRAL, T.DateType, T.DecimalType)


def _finite(column: str) -> Convert:
    def convert(value: float) -> float:
        if not math.isfinite(value):
            raise InvalidInput(
                f"column {column!r} holds {value}, which JSON cannot hold: fill or filter it "
                "before dispatching (df.na.fill, df.where)"
            )
        return value

    return convert


def _timestamp(value: datetime) -> str:
    if value.tzinfo is None:  # Arrow gives the session's zone; be safe
        value = value.replace(tzinfo=UTC)
    return _timestamp_ntz(value.astimezone(UTC).replace(tzinfo=None)) + "Z"


def _timestamp_ntz(value: datetime) -> str:
    # isoformat, not strftime: %Y writes year 999 as '999', not '0999'
    return value.isoformat(timespec="microseconds")


def _date(value: date) -> str:
    return value.isoformat()


def _decimal(value: Decimal) -> str:
    # fixed point at the column's scale: str() writes 0 at scale 7 as '0E-7'
    return format(value, "f")


def _binary(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _key(value: Any) -> str:
    if isinstance(value, str):
        return value
    return _decimal(value) if isinstance(value, Decimal) else str(value)


def _or_none(convert: Convert) -> Convert:
    def maybe(value: Any) -> Any:
        return None if value is None else convert(value)

    return maybe


def _array(inner: Convert | None) -> Convert:
    if inner is None:
        return list
    return lambda values: [None if v is None else inner(v) for v in values]


def _struct(fields: list[tuple[str, Convert | None]]) -> Convert:
    converting = [(name, conv) for name, conv in fields if conv is not None]
    if not converting:
        return dict

    def convert(value: dict) -> dict:
        out = dict(value)
        for name, conv in converting:
            item = out.get(name)
            if item is not None:
                out[name] = conv(item)
        return out

    return convert


def _map(value_conv: Convert | None) -> Convert:
    # Arrow's to_pylist gives a map as a list of (key, value) pairs
    if value_conv is None:
        return lambda pairs: {_key(k): v for k, v in pairs}
    return lambda pairs: {_key(k): None if v is None else value_conv(v) for k, v in pairs}


def converter(dtype: T.DataType, column: str) -> Convert | None:
    """The function mapping a non-null value of `dtype` to JSON; None when the value is JSON
    already. InvalidInput naming `column` for a type with no mapping."""
    if isinstance(dtype, PLAIN):
        return None
    if isinstance(dtype, T.FloatType | T.DoubleType):
        return _finite(column)
    if isinstance(dtype, T.DecimalType):
        return _decimal
    if isinstance(dtype, T.DateType):
        return _date
    if isinstance(dtype, T.TimestampNTZType):
        return _timestamp_ntz
    if isinstance(dtype, T.TimestampType):
        return _timestamp
    if isinstance(dtype, T.BinaryType):
        return _binary
    if isinstance(dtype, T.ArrayType):
        return _array(converter(dtype.elementType, f"{column}[]"))
    if isinstance(dtype, T.StructType):
        names = [field.name for field in dtype.fields]
        if len(set(names)) != len(names):
            raise InvalidInput(f"column {column!r} is a struct with duplicate field names")
        return _struct(
            [(f.name, converter(f.dataType, f"{column}.{f.name}")) for f in dtype.fields]
        )
    if isinstance(dtype, T.MapType):
        if not isinstance(dtype.keyType, KEY_TYPES):
            raise InvalidInput(
                f"column {column!r} is a map with {dtype.keyType.simpleString()} keys; JSON "
                "object keys are text: use string, integral, date or decimal keys"
            )
        return _map(converter(dtype.valueType, f"{column}{{}}"))
    raise InvalidInput(
        f"column {column!r} has type {dtype.simpleString()}, which queasy does not map to "
        "JSON: cast it (e.g. to string or long) or leave it out of the data columns"
    )


def column_converter(dtype: T.DataType, column: str) -> Convert | None:
    """converter() for the values of a whole column, nulls included."""
    conv = converter(dtype, column)
    return None if conv is None else _or_none(conv)
