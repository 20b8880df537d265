"""Tolerant parsers for numbers and text read back from Redis. None of them ever raises.

Redis hands back bytes (or str, or int from Lua integer replies), and Lua's `tostring` of a
large number is in exponent form (`tostring(253402300799000)` is `'2.53402300799e+14'`). A
field someone wrote by hand may hold anything. Every reader of a number from Redis goes
through these functions:

    to_int(b"42") == 42             to_int(b"1e+20") == 10**20     to_int(b"x", 0) == 0
    to_float(b"2.5") == 2.5         to_float(b"nan") is None       to_float(None, 1.0) == 1.0
    ms_to_seconds(b"1500") == 1.5   ms_to_seconds(b"", 0.0) == 0.0
    text(b"abc") == "abc"           text(b"\\xff") == "\\ufffd"

Malformed input (not a number, NaN, +-inf, wrong type) gives `default`.
"""

from __future__ import annotations

import math
from typing import TypeVar

D = TypeVar("D")

#: longest text parsed as a number (a field of megabytes is garbage, not a number)
_MAX_DIGITS = 400


def to_float(raw: object, default: D = None) -> float | D:  # type: ignore[assignment]
    """A finite float from bytes/str/int/float (decimal or exponent form), else `default`."""
    if isinstance(raw, bool):
        return default
    if isinstance(raw, int):
        try:
            return float(raw)
        except OverflowError:
            return default
    if isinstance(raw, float):
        return raw if math.isfinite(raw) else default
    if isinstance(raw, bytes | bytearray | memoryview):
        try:
            raw = bytes(raw).decode("ascii")
        except UnicodeDecodeError:
            return default
    if not isinstance(raw, str) or len(raw) > _MAX_DIGITS:
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if math.isfinite(value) else default


def to_int(raw: object, default: D = None) -> int | D:  # type: ignore[assignment]
    """An int from bytes/str/int, also `'1e+20'` or `'2.0'` (truncated), else `default`."""
    if isinstance(raw, bool):
        return default
    if isinstance(raw, int):
        return raw
    if isinstance(raw, bytes | bytearray | memoryview | str):
        text_ = raw if isinstance(raw, str) else bytes(raw).decode("ascii", "replace")
        if len(text_) <= _MAX_DIGITS:
            try:
                return int(text_)
            except ValueError:
                pass
    value = to_float(raw)
    return default if value is None else int(value)


def ms_to_seconds(raw: object, default: D = None) -> float | D:  # type: ignore[assignment]
    """Epoch (or duration) milliseconds as read from Redis, in seconds; else `default`."""
    value = to_float(raw)
    return default if value is None else value / 1000.0


def text(raw: object, default: str = "") -> str:
    """A str from bytes (invalid UTF-8 replaced) or str; `default` for anything else."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, bytes | bytearray | memoryview):
        return bytes(raw).decode("utf-8", "replace")
    return default
