"""Checks on producer input. Each raises InvalidInput naming what is wrong; none writes."""

from __future__ import annotations

import math
import re
from datetime import datetime

import orjson

from .errors import InvalidInput

QUEUE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
MAX_ID_LENGTH = 256
#: the latest run_at accepted, in epoch seconds: 9999-12-31T23:59:59Z (the earliest is 0)
MAX_RUN_AT = 253402300799
#: the longest configured duration (timeouts, backoffs, intervals), in seconds (~31.7 years)
MAX_DURATION = 1e9
#: the deepest nesting of lists/dicts in job data (orjson's own limit: it refuses 255)
MAX_DEPTH = 254


def key_prefix(value: object) -> str:
    """A key prefix: a non-empty str without braces (they would change the keys' hash tag)."""
    if not isinstance(value, str) or not value or "{" in value or "}" in value:
        raise InvalidInput(f"invalid key prefix {value!r}: a non-empty str without braces")
    return value


def queue_name(name: object) -> str:
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise InvalidInput(
            f"invalid queue name {shown(name, 120)}: use 1-100 characters of A-Z a-z 0-9 _ . : -"
        )
    return name


def payload_limit(value: object) -> int:
    """A client's max_payload: bytes of encoded job data, an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"max_payload must be an int >= 1 (bytes), not {shown(value)}")
    return value


#: the usual id: 1-256 printable ASCII characters, no space (the rule below, checked faster)
PLAIN_ID = re.compile(r"[!-~]{1,256}")


def job_id(value: object) -> str:
    if type(value) is str and PLAIN_ID.fullmatch(value):
        return value
    if not isinstance(value, str):
        raise InvalidInput(f"job id must be a str, not {type(value).__name__}")
    if not value or len(value) > MAX_ID_LENGTH:
        raise InvalidInput(f"job id must be 1-{MAX_ID_LENGTH} characters, got {len(value)}")
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise InvalidInput(f"job id {value!r} contains whitespace or control characters")
    return value


def _check_json(value: object, path: str, depth: int = 0, what: str = "job data") -> None:
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return
    if depth >= MAX_DEPTH and (kind is dict or kind is list or kind is tuple):
        # also what stops a list that contains itself (a RecursionError before)
        raise InvalidInput(f"{what} is nested deeper than {MAX_DEPTH} levels (at {path[:60]}...)")
    if kind is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise InvalidInput(f"{what} at {path} is {value}, which JSON cannot hold")
        return
    if kind is dict:
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                raise InvalidInput(f"{what} at {path} has a non-str key {key!r}")
            _check_json(item, f"{path}.{key}", depth + 1, what)
        return
    if kind is list or kind is tuple:
        for index, item in enumerate(value):  # type: ignore[arg-type]
            _check_json(item, f"{path}[{index}]", depth + 1, what)
        return
    raise InvalidInput(
        f"{what} at {path} is a {kind.__name__}; only JSON values are accepted "
        "(dict with str keys, list, str, int, finite float, bool, None)"
    )


def encode_data(data: object, max_bytes: int, what: str = "job data") -> bytes:
    """JSON-encode job data (or, `what`, a handler's result), rejecting anything JSON cannot
    round-trip and oversized data."""
    _check_json(data, "$", 0, what)
    try:
        encoded = orjson.dumps(data)
    except orjson.JSONEncodeError as exc:  # ints over 64 bits, lone surrogates, deep nesting
        raise InvalidInput(f"{what} cannot be encoded as JSON: {exc}") from None
    if len(encoded) > max_bytes:
        raise InvalidInput(
            f"{what} is {len(encoded)} bytes encoded, over the limit of {max_bytes} bytes"
        )
    return encoded


def run_at_ms(run_at: object, delay: object, now: float) -> int | None:
    """Epoch milliseconds from run_at (aware datetime or epoch seconds) or delay (seconds).

    Both are bounded: run_at within 0..MAX_RUN_AT, delay >= 0 with now + delay <= MAX_RUN_AT.
    """
    if run_at is not None and delay is not None:
        raise InvalidInput("give run_at or delay, not both")
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay != delay:
            raise InvalidInput(f"delay must be a number of seconds, not {delay!r}")
        if delay < 0:
            raise InvalidInput(f"delay must be >= 0 seconds, got {delay}")
        if delay > MAX_RUN_AT - now:  # (no float overflow for a huge int or inf)
            raise InvalidInput(
                f"delay must be at most {int(MAX_RUN_AT - now)} seconds (now + delay within "
                f"year 9999, epoch {MAX_RUN_AT}), got {shown(delay)}"
            )
        return ms_not_before(now + delay)
    if run_at is None:
        return None
    return ms_not_before(epoch_seconds(run_at, "run_at"))


def ms_not_before(seconds: float) -> int:
    """The first whole millisecond not before `seconds`: the library keeps times in ms, and a
    job must never become due before the time asked (1.0005 s -> 1001 ms, not 1000). A float a
    microsecond or less above a whole ms (1.001 * 1000 = 1001.0000000000001) is that ms."""
    ms = seconds * 1000
    whole = int(ms)
    return whole if ms - whole <= 1e-3 else whole + 1


def shown(value: object, limit: int = 40) -> str:
    """repr(value), cut to about `limit` characters (a huge int is thousands of digits)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit // 2]}...({len(text)} characters)"


def epoch_seconds(value: object, name: str) -> float:
    """Epoch seconds of an aware datetime or a number, within 0..MAX_RUN_AT."""
    if isinstance(value, datetime):
        if value.utcoffset() is None:  # no tzinfo, or one without an offset (naive too)
            raise InvalidInput(f"{name} is a naive datetime; give one with a tzinfo")
        seconds: float = value.timestamp()
    elif isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise InvalidInput(f"{name} must be an aware datetime or epoch seconds, not {value!r}")
    else:
        seconds = value  # compared before any conversion: a huge int never overflows
    if not 0 <= seconds <= MAX_RUN_AT:
        raise InvalidInput(
            f"{name} must be within 0..{MAX_RUN_AT} epoch seconds (1970 to the end of "
            f"year 9999), got {shown(value)}"
        )
    return float(seconds)


def run_at_mode(value: object) -> str:
    if value is True:
        return "replace"
    if value is False:
        return "keep"
    if value in ("if_later", "if_earlier"):
        return value  # type: ignore[return-value]
    raise InvalidInput(
        f"update_run_at must be True, False, 'if_later' or 'if_earlier', not {value!r}"
    )
