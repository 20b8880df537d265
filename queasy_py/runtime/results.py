"""What a worker reports for a job: the JSON-safe description of a handler's error, its
return value when the queue stores results, and the encoding of a batch of results that no
value can break.

A result is [seq, started_ms, error_or_null], or [seq, started_ms, null, value] with the
return value as JSON text (a queue with store_results);
error = {"name", "message", "kind": "permanent"|"retriable", "retry_at": secs|null,
         "traceback": str|null (the last TRACEBACK_BYTES of the formatted traceback)}.
"""

from __future__ import annotations

import logging
import math
import traceback
from typing import Any

import orjson

from .. import defaults
from ..errors import PermanentError

log = logging.getLogger("queasy_py.worker")

#: the latest retry_at a handler may ask for: 9999-12-31T23:59:59Z, in epoch seconds
MAX_RETRY_AT = 253402300799.0
MAX_MESSAGE = 4000  # characters of an error message kept


def _text(value: object, fallback: str) -> str:
    """str(value), cut and made valid UTF-8 (lone surrogates escaped); `fallback` if it fails."""
    try:
        text = str(value)
    except BaseException:  # noqa: BLE001 - an exception whose __str__ fails (even with a
        # SystemExit, which would end the worker's event loop thread) still gets reported
        return fallback
    return text[:MAX_MESSAGE].encode("utf-8", "backslashreplace").decode("utf-8")


def retry_at_of(exc: BaseException) -> float | None:
    """The exception's `retry_at` (aware datetime or epoch seconds) as a finite float in
    0 .. MAX_RETRY_AT, else None (the job is retried with the normal backoff)."""
    try:
        value = getattr(exc, "retry_at", None)
        if value is None or isinstance(value, bool):
            return None
        if hasattr(value, "timestamp"):
            value = value.timestamp()
        at = float(value)
    except BaseException:  # noqa: BLE001 - user code: whatever it raises reads as "not set"
        return None
    if not math.isfinite(at) or not 0.0 <= at <= MAX_RETRY_AT:
        return None
    return at


def traceback_of(exc: BaseException, limit: int = defaults.TRACEBACK_BYTES) -> str | None:
    """The formatted traceback of `exc` (its chained causes included), its last `limit`
    bytes of UTF-8 (lone surrogates escaped); None when it cannot be formatted."""
    try:
        text = "".join(traceback.format_exception(exc))
    except BaseException:  # noqa: BLE001 - a __str__ that raises SystemExit included
        return None
    raw = text.encode("utf-8", "backslashreplace")
    if len(raw) > limit:  # the end holds the innermost frame and the error itself
        raw = raw[-limit:]
    return raw.decode("utf-8", "ignore")  # a character cut at the start is dropped


def describe_error(exc: BaseException) -> dict[str, Any]:
    """The JSON-safe description of a handler's exception; never raises."""
    try:
        name = _text(type(exc).__name__, "Exception")
    except BaseException:  # noqa: BLE001 - a metaclass whose __name__ raises
        name = "Exception"
    message = _text(exc, f"<unprintable {name}>")
    try:  # user attributes may be properties that raise: any failure reads as "not set"
        permanent = getattr(exc, "kind", None) == PermanentError.kind
    except BaseException:  # noqa: BLE001 - SystemExit too: it would end the event loop
        permanent = False
    return {
        "name": name,
        "message": message,
        "kind": "permanent" if permanent is True else "retriable",
        "retry_at": retry_at_of(exc),
        "traceback": traceback_of(exc),
    }


def invalid_result(job: Any, reason: str) -> dict[str, Any]:
    """The error of a job whose handler returned a value its queue cannot store as a result
    (not JSON, or too large): a permanent failure of that job alone."""
    return {
        "name": "InvalidResult",
        "message": _text(
            f"the handler of {job.queue} job {job.id} returned a value that "
            f"cannot be stored as its result: {reason}",
            "?",
        ),
        "kind": "permanent",
        "retry_at": None,
        "traceback": None,
    }


def invalid_data(job_id: str, raw: bytes, exc: Exception) -> dict[str, Any]:
    """The error of a job whose stored data is not JSON (written around the producer API)."""
    head = raw[:200]
    return {
        "name": "InvalidJobData",
        "message": f"the data of job {job_id!r} is not valid JSON ({exc}); its handler was not "
        f"run; the data begins {head!r}",
        "kind": "permanent",
        "retry_at": None,
        "traceback": None,
    }


def unencodable(exc: Exception) -> dict[str, Any]:
    return {
        "name": "UnencodableResult",
        "message": _text(f"the worker could not encode this job's result: {exc}", "?"),
        "kind": "permanent",
        "retry_at": None,
        "traceback": None,
    }


def encode_results(batch: list[list[Any]]) -> bytes:
    """orjson of a batch of results. A result that cannot be encoded becomes a permanent
    failure of its job (UnencodableResult); the others are sent as they are."""
    try:
        return orjson.dumps(batch)
    except Exception:
        pass
    parts = []
    for item in batch:
        try:
            parts.append(orjson.dumps(item))
        except Exception as exc:
            log.error("result of job seq %s cannot be encoded: %s", item[0], exc)
            parts.append(orjson.dumps([item[0], item[1], unencodable(exc)]))
    return b"[" + b",".join(parts) + b"]"


def check_result(result: Any, job: Any) -> None:
    """Results of a queue that does not store them are discarded; a non-JSON one is a
    handler bug worth a log line."""
    if result is not None:
        try:
            orjson.dumps(result)
        except TypeError as exc:
            log.warning(
                "handler of %s job %s returned a non-JSON value: %s", job.queue, job.id, exc
            )


def stored_result(result: Any, job: Any) -> tuple[str | None, dict[str, Any] | None]:
    """(the JSON text of a handler's return value, None), or (None, the InvalidResult error)
    when it is not JSON or larger than MAX_PAYLOAD_BYTES."""
    from ..errors import InvalidInput
    from ..validate import encode_data  # only for queues that store results

    try:
        encoded = encode_data(result, defaults.MAX_PAYLOAD_BYTES, "the return value")
    except InvalidInput as exc:
        return None, invalid_result(job, str(exc))
    except BaseException as exc:  # noqa: BLE001 - the check itself failed on the value (a
        # key whose repr raises, SystemExit included): the job fails, its result is sent,
        # rather than none and a timeout (or, for an async handler, a dead event loop)
        return None, invalid_result(job, f"{_text(type(exc).__name__, '?')}: {_text(exc, '?')}")
    return encoded.decode(), None
