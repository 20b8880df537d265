"""Options of a listened queue (Queue.listen keywords), checked once, applied at dequeue time."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from . import defaults
from .errors import InvalidInput
from .validate import MAX_DURATION, shown

#: the supervisor settings that are durations in seconds (bounded by MAX_DURATION)
DURATIONS = ("heartbeat_interval", "shutdown_timeout", "poll_interval")
#: the largest count the library takes (lua/queasy.lua MAX_COUNT: events maxlen, keep count,
#: expiry ms); a larger one would be refused by every call that carries it
MAX_COUNT = 999_999_999_999


def _int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise InvalidInput(f"{name} must be an int {bound}, not {value!r}")
    return value


def _keep(name: str, value: Any, default: dict[str, Any]) -> tuple[int, float]:
    """A retention: {"count": int >= 0, "seconds": >= 0} (a missing key: its default)."""
    if not isinstance(value, dict):
        raise InvalidInput(f'{name} must be a dict {{"count": n, "seconds": s}}, not {value!r}')
    unknown = set(value) - {"count", "seconds"}
    if unknown:
        raise InvalidInput(f"{name} has unknown key(s) {sorted(unknown)}: count, seconds")
    merged = {**default, **value}
    count = _int(f"{name}['count']", merged["count"], 0, MAX_COUNT)
    return count, _seconds(f"{name}['seconds']", merged["seconds"])


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{name} must be True or False, not {value!r}")
    return value


def _seconds(name: str, value: Any, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise InvalidInput(f"{name} must be a number of seconds, not {value!r}")
    if value < 0 or (positive and value == 0):
        raise InvalidInput(f"{name} must be {'> 0' if positive else '>= 0'}, not {value!r}")
    if value > MAX_DURATION:  # compared before float(): a huge int never overflows
        raise InvalidInput(f"{name} must be at most {MAX_DURATION:g} seconds, not {shown(value)}")
    return float(value)


@dataclass(frozen=True, slots=True)
class ListenOptions:
    queue: str
    handler: str
    size: int
    priority: int
    timeout: float
    max_retries: int
    max_stalls: int
    max_timeouts: int
    min_backoff: float
    max_backoff: float
    fail_handler: str | None
    fail_options: dict[str, Any] = field(default_factory=dict)
    events_maxlen: int = defaults.EVENTS_MAXLEN
    #: records of ended jobs kept: (count, seconds)
    keep_finished: tuple[int, float] = tuple(defaults.KEEP_FINISHED.values())  # type: ignore[assignment]
    keep_failed: tuple[int, float] = tuple(defaults.KEEP_FAILED.values())  # type: ignore[assignment]
    store_results: bool = False
    schedule: str | None = None
    schedule_every: float | None = None
    timezone: str = defaults.LISTEN["timezone"]
    catch_up: str = defaults.LISTEN["catch_up"]

    @classmethod
    def build(cls, queue: str, handler: str, options: dict[str, Any], check: bool = True):
        unknown = set(options) - set(defaults.LISTEN)
        if unknown:
            raise InvalidInput(f"unknown listen option(s) {sorted(unknown)} for queue {queue!r}")
        o = {**defaults.LISTEN, **options}
        fail_options = o["fail_options"] or {}
        if not isinstance(fail_options, dict):
            raise InvalidInput(f"fail_options must be a dict, not {fail_options!r}")
        own = {"fail_handler", "fail_options", *defaults.SCHEDULE_KEYS}
        bad = set(fail_options) - (set(defaults.LISTEN) - own)
        if bad:
            raise InvalidInput(f"unknown fail_options key(s) {sorted(bad)} for queue {queue!r}")
        spec = cls(
            queue=queue,
            handler=handler,
            size=_int("size", o["size"], 1, defaults.WORKER_UNITS),
            priority=_int("priority", o["priority"], -(2**31), 2**31),
            timeout=_seconds("timeout", o["timeout"], positive=True),
            max_retries=_int("max_retries", o["max_retries"], 0),
            max_stalls=_int("max_stalls", o["max_stalls"], 1),
            max_timeouts=_int("max_timeouts", o["max_timeouts"], 1),
            min_backoff=_seconds("min_backoff", o["min_backoff"]),
            max_backoff=_seconds("max_backoff", o["max_backoff"]),
            fail_handler=o["fail_handler"],
            fail_options=dict(fail_options),
            events_maxlen=_int("events_maxlen", o["events_maxlen"], 0, MAX_COUNT),
            keep_finished=_keep("keep_finished", o["keep_finished"], defaults.KEEP_FINISHED),
            keep_failed=_keep("keep_failed", o["keep_failed"], defaults.KEEP_FAILED),
            store_results=_bool("store_results", o["store_results"]),
            **_schedule(queue, o),
        )
        if spec.min_backoff > spec.max_backoff:
            raise InvalidInput(
                f"min_backoff ({spec.min_backoff}) is larger than max_backoff ({spec.max_backoff})"
            )
        if spec.fail_handler is not None and not isinstance(spec.fail_handler, str):
            raise InvalidInput(f"fail_handler must be a module path, not {spec.fail_handler!r}")
        if check:  # listen() checks the handlers import: the runtime is needed now
            from .runtime.handler import load

            load(handler)
            if spec.fail_handler is not None:
                load(spec.fail_handler)
        if spec.fail_handler is not None:  # check fail_options values (named as such)
            spec.fail_spec(queue + defaults.FAIL_QUEUE_SUFFIX)
        if spec.schedule is not None or spec.schedule_every is not None:
            from .runtime.schedules import build  # lazily: the cron parser

            build(queue, spec)  # parses the expression: InvalidInput names what is wrong
        return spec

    def fail_spec(self, fail_queue: str) -> ListenOptions:
        """Options of the fail queue: FAIL_OPTIONS defaults, then this queue's fail_options."""
        assert self.fail_handler is not None
        merged = {**defaults.FAIL_OPTIONS, **self.fail_options}
        try:
            base = ListenOptions.build(fail_queue, self.fail_handler, merged, check=False)
        except InvalidInput as exc:  # named as given: not read as the queue's own size
            raise InvalidInput(f"queue {self.queue!r}, fail_options: {exc}") from None
        return replace(base, fail_handler=None)

    def backoff(self, retry_count: int) -> float:
        """Seconds before retry number retry_count + 1 (without jitter)."""
        return min(self.max_backoff, self.min_backoff * 2 ** min(retry_count, 64))


def _schedule(queue: str, o: dict[str, Any]) -> dict[str, Any]:
    """The schedule keywords, type-checked (runtime/schedules.py parses the expression)."""
    cron, every, zone, catch_up = (o[k] for k in defaults.SCHEDULE_KEYS)
    if cron is not None and (not isinstance(cron, str) or not cron.strip()):
        raise InvalidInput(f"queue {queue!r}: schedule must be a cron expression, not {cron!r}")
    if every is not None:
        every = _seconds(f"queue {queue!r}: schedule_every", every)
        if every < 0.001:
            raise InvalidInput(f"queue {queue!r}: schedule_every must be at least 0.001 s")
    if not isinstance(zone, str) or not zone:
        raise InvalidInput(f"queue {queue!r}: timezone must be an IANA name, not {zone!r}")
    if catch_up not in defaults.CATCH_UP:
        raise InvalidInput(
            f"queue {queue!r}: catch_up must be one of {defaults.CATCH_UP}, not {catch_up!r}"
        )
    if cron is not None and every is not None:
        raise InvalidInput(f"queue {queue!r}: give schedule or schedule_every, not both")
    if cron is None and zone != defaults.LISTEN["timezone"]:
        raise InvalidInput(f"queue {queue!r}: timezone is for a cron schedule; none given")
    if cron is None and every is None and catch_up != defaults.LISTEN["catch_up"]:
        raise InvalidInput(f"queue {queue!r}: catch_up needs a schedule; none given")
    return {"schedule": cron, "schedule_every": every, "timezone": zone, "catch_up": catch_up}


def check_setting(key: str, value: Any) -> Any:
    """Check one supervisor setting (defaults.SUPERVISOR); InvalidInput names what is wrong."""
    if key == "workers":
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise InvalidInput(f"workers must be an int >= 0, not {value!r}")
        return value
    if key == "metrics_port":
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535
        ):
            raise InvalidInput(f"metrics_port must be None or a port 0-65535, not {value!r}")
        return value
    if key == "metrics_host":
        if not isinstance(value, str) or not value:
            raise InvalidInput(f"metrics_host must be a host name or address, not {value!r}")
        return value
    if key == "heartbeat_interval":  # a client's expiry, twice it in ms, goes to the library
        seconds = _seconds(key, value, positive=True)
        low = defaults.MIN_HEARTBEAT_INTERVAL
        if not low <= seconds or not int(seconds * 2000) <= MAX_COUNT:  # heartbeat.py expiry_ms
            raise InvalidInput(
                f"{key} must be {low}..{MAX_COUNT // 2000} seconds (a shorter one expires "
                f"supervisors between two heartbeats; its expiry, twice it in ms, goes up to "
                f"{MAX_COUNT}), not {shown(value)}"
            )
        return seconds
    if key == "max_jobs_per_worker":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInput(
                f"{key} must be a whole number of jobs >= 0 (0: never recycle), not {shown(value)}"
            )
        return value
    if key in DURATIONS:
        return _seconds(key, value, positive=key.endswith("interval"))
    if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
        raise InvalidInput(f"{key} must be a number, not {value!r}")
    if value < 0:
        raise InvalidInput(f"{key} must be >= 0, not {value!r}")
    return value


def _finite(value: int | float) -> bool:
    return isinstance(value, int) or math.isfinite(value)
