"""What Queue and AsyncQueue share: the arguments of the library's calls (dispatch's flags
and encoding, dispatch_many's chunks, dispatch_batch's window), the parse of their replies
(BatchResult, JobInfo, ScheduleInfo, counts), and new job ids."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import defaults, records, validate
from .errors import InvalidInput
from .job import JobInfo, ScheduleInfo
from .operate import OperateArgs
from .store import fields
from .store.keys import QueueKeys, RegistryKeys
from .store.library import Dispatched, lua_error
from .tracing import traceparent

log = logging.getLogger("queasy_py")

#: jobs per FCALL in dispatch_many (the chunks are pipelined in one round trip)
DISPATCH_CHUNK = 500
#: the longest dedup_window of dispatch_batch, in seconds (the library's bound, 999999999999 ms)
MAX_DEDUP_WINDOW = 999_999_999.0


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What Queue.dispatch_batch did: the ids in the order given, one code per job."""

    ids: list[str]
    codes: list[Dispatched]

    def _count(self, *codes: Dispatched) -> int:
        return sum(1 for code in self.codes if code in codes)

    @property
    def created(self) -> int:
        return self._count(Dispatched.CREATED)

    @property
    def updated(self) -> int:
        """Waiting, delayed or blocked jobs of these ids that were updated."""
        return self._count(Dispatched.UPDATED, Dispatched.BLOCKED_UPDATED)

    @property
    def blocked(self) -> int:
        """New blocked jobs: these ids were active (never with a dedup_window)."""
        return self._count(Dispatched.BLOCKED)

    @property
    def skipped(self) -> int:
        """Ids left alone by a dedup_window: active, or dispatched within their window."""
        return self._count(Dispatched.SKIPPED)


def new_job_id() -> str:
    """A unique, URL-safe job id: 128 random bits as 32 hex characters (a uuid4 object
    costs four times as much, a tenth of a dispatch_many)."""
    return os.urandom(16).hex()


def new_job_ids(count: int) -> list[str]:
    """`count` ids as new_job_id's, from one read of the system's random source."""
    hexes = os.urandom(16 * count).hex()
    return [hexes[i : i + 32] for i in range(0, 32 * count, 32)]


class QueueBase(OperateArgs):
    """Validation, FCALL arguments and reply parsing shared by Queue and aio.AsyncQueue."""

    def __init__(self, client: Any, name: str, tag: str | None = None) -> None:
        self.client = client
        self.name = validate.queue_name(name)
        self.keys = QueueKeys(client.prefix, self.name, tag or self.name)
        self.registered = False  # its name is in the registry of queues (Client.queues)
        self.register_after = 0.0  # monotonic time before which no registry write is tried

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    def _wants_register(self) -> bool:
        return not self.registered and time.monotonic() >= self.register_after

    def _unregistered(self, exc: Exception) -> None:
        """The registry write of a dispatch failed to reach Redis. On a cluster the registry
        (one key) lives on one primary, most often not this queue's: the dispatch goes on
        without it (a WARNING), and the next one after REGISTRY_RETRY seconds tries again;
        a down primary would otherwise stop every queue's first dispatch, and a frozen one
        hold each dispatch for a socket timeout. On one server `exc` is raised."""
        if not self.client.cluster:
            raise exc
        self.register_after = time.monotonic() + defaults.REGISTRY_RETRY
        log.warning(
            "queue %r: the registry of queues (%s, Client.queues) is on a Redis Cluster primary "
            "that does not answer (%s); dispatching without it, trying again in %gs",
            self.name, RegistryKeys(self.client.prefix).queues, exc, defaults.REGISTRY_RETRY,
        )  # fmt: skip

    def _flags(self, update_data: bool, update_run_at: object, reset_counts: bool | None) -> list:
        if not isinstance(update_data, bool):
            raise InvalidInput(f"update_data must be True or False, not {update_data!r}")
        if reset_counts is None:
            reset_counts = update_data
        elif not isinstance(reset_counts, bool):
            raise InvalidInput(f"reset_counts must be True, False or None, not {reset_counts!r}")
        mode = validate.run_at_mode(update_run_at)
        return ["1" if update_data else "0", mode, "1" if reset_counts else "0"]

    def _encode(self, data: Any, id: str | None, run_at: Any, delay: Any) -> list:
        job_id = new_job_id() if id is None else validate.job_id(id)
        encoded = validate.encode_data(data, self.client.max_payload)
        at = validate.run_at_ms(run_at, delay, time.time())
        return [job_id, encoded, "" if at is None else at]

    def _dispatch_args(
        self,
        data: Any,
        id: str | None,
        run_at: Any,
        delay: Any,
        update_data: bool,
        update_run_at: object,
        reset_counts: bool | None,
    ) -> list:
        """ARGV of queasy_dispatch for one job; its id is ARGV[6] (index 5)."""
        flags = self._flags(update_data, update_run_at, reset_counts)
        return ["", *flags, traceparent(), *self._encode(data, id, run_at, delay)]

    def _dispatch_many_args(
        self,
        jobs: Iterable[Mapping[str, Any]],
        update_data: bool,
        update_run_at: object,
        reset_counts: bool | None,
    ) -> tuple[list[list], list[str]]:
        """ARGV of each queasy_dispatch chunk, and the ids. Checks every job first."""
        flags = self._flags(update_data, update_run_at, reset_counts)
        if isinstance(jobs, str | bytes | Mapping) or not isinstance(jobs, Iterable):
            raise InvalidInput(
                "jobs must be a list (an iterable) of job mappings "
                f'({{"data": ..., "id": ...}}), not {validate.shown(jobs)}'
            )
        args: list[Any] = []
        for index, job in enumerate(jobs):
            if not isinstance(job, Mapping) or "data" not in job:
                raise InvalidInput(f"jobs[{index}] must be a mapping with a 'data' key")
            unknown = set(job) - {"data", "id", "run_at", "delay"}
            if unknown:
                raise InvalidInput(f"jobs[{index}] has unknown keys {sorted(unknown)}")
            try:
                args.extend(
                    self._encode(job["data"], job.get("id"), job.get("run_at"), job.get("delay"))
                )
            except InvalidInput as exc:
                raise InvalidInput(f"jobs[{index}]: {exc}") from None
        return self._chunks(flags, args), args[0::3]

    @staticmethod
    def _reserved_at(ids: list[str], chunks: list[list]) -> int | None:
        """The index of a job of a batch of several chunks with the id of a schedule's
        occurrence, if any: the library refuses it while the queue has a schedule, one FCALL
        at a time, so the batch asks first (a refused chunk would leave the others written)."""
        if len(chunks) < 2 or defaults.SCHEDULE_ID not in ids:
            return None
        return ids.index(defaults.SCHEDULE_ID)

    @staticmethod
    def _refuse_reserved(index: int, info: ScheduleInfo | None) -> None:
        """InvalidInput, as the library words it, when the queue has a schedule (`info`)."""
        if info is not None:
            raise InvalidInput(
                f"jobs[{index}]: id {defaults.SCHEDULE_ID!r} is reserved: the id of the "
                "occurrence of this queue's schedule"
            )

    @staticmethod
    def _chunks(flags: list, args: list) -> list[list]:
        """ARGV of each queasy_dispatch chunk of DISPATCH_CHUNK triples of `args`."""
        step = DISPATCH_CHUNK * 3
        trace = traceparent()
        return [["", *flags, trace, *args[i : i + step]] for i in range(0, len(args), step)]

    @staticmethod
    def _refused(exc: Exception, chunks: list[list]) -> Exception:
        """The error of pipelined chunks of jobs (_chunks) one of which was refused
        (lua_error): when others ran (a pipeline is not one step: the server's maxmemory
        reached in the middle, say), it says which jobs were dispatched all the same."""
        error = lua_error(exc)  # type: ignore[arg-type]
        applied = getattr(exc, "applied", None)
        if not applied:
            return error
        starts = [0]
        for args in chunks:
            starts.append(starts[-1] + (len(args) - 5) // 3)
        ranges: list[list[int]] = []
        for i in applied:
            if ranges and ranges[-1][1] == starts[i]:
                ranges[-1][1] = starts[i + 1]
            else:
                ranges.append([starts[i], starts[i + 1]])
        done = ", ".join(f"jobs[{start}:{end}]" for start, end in ranges)
        refused = len(chunks) - len(applied)
        text = (
            f"{error} ({refused} of the {len(chunks)} pipelined calls of up to "
            f"{DISPATCH_CHUNK} jobs refused; {done} of {starts[-1]} were dispatched all the "
            "same, the others were not)"
        )
        try:
            return type(error)(text)
        except Exception:  # an error class that takes other arguments: its message as it is
            return error

    @staticmethod
    def _batch_calls(chunks: list[list], window: int | None) -> tuple[str, list[list]]:
        """The function and ARGV of dispatch_batch's chunks: with a dedup window (ms),
        queasy_dispatch_once, the window in the trace's place."""
        if window is None:
            return "queasy_dispatch", chunks
        return "queasy_dispatch_once", [[*args[:4], window, *args[5:]] for args in chunks]

    @staticmethod
    def _window_ms(dedup_window: object) -> int:
        if (
            isinstance(dedup_window, bool)
            or not isinstance(dedup_window, int | float)
            or not math.isfinite(dedup_window)
            or not 0 < dedup_window <= MAX_DEDUP_WINDOW
        ):
            raise InvalidInput(
                f"dedup_window must be seconds in (0, {MAX_DEDUP_WINDOW:.0f}], not "
                f"{validate.shown(dedup_window)}"
            )
        return max(1, round(dedup_window * 1000))

    def _cancel_args(self, job_id: str) -> list:
        keep = defaults.KEEP_CANCELLED
        keep_ms = int(keep["seconds"] * 1000)
        return ["", defaults.EVENTS_MAXLEN, validate.job_id(job_id), keep["count"], keep_ms]

    def _job_info(self, row: list | None) -> JobInfo | None:
        return records.job_info(self.name, row)

    def _unscheduled(self, reply: list, cancelled: bool) -> bool | None:
        """A reply of queasy_unschedule: True dropped, False there was none, None its pending
        occurrence is to be cancelled first (`cancelled`: it was, and one is pending again)."""
        code, state = int(reply[0]), fields.text(reply[1])
        if code != 2:
            return code == 1
        if state == "waiting" and not cancelled:
            return None
        if state == "waiting":  # cancelled, and created again right away
            raise InvalidInput(
                f"the schedule of {self.name} is not dropped: a supervisor still listens with "
                "it (it created the next occurrence again): remove it from their config first"
            )
        raise InvalidInput(
            f"the schedule of {self.name} is not dropped: its occurrence runs; drop it when "
            "the run has ended (remove it from the supervisors' config first)"
        )

    def _schedule_info(self, row: list | None) -> ScheduleInfo | None:
        if row is None:
            return None
        spec, fire_at, state, last_fire_at, outcome, ended, skipped = (
            fields.text(value) for value in row
        )

        def seconds(ms: str) -> float | None:
            return fields.ms_to_seconds(ms, 0.0) if ms else None

        return ScheduleInfo(
            queue=self.name,
            spec=spec,
            fire_at=seconds(fire_at),
            state=state or None,  # type: ignore[arg-type]
            last_fire_at=seconds(last_fire_at),
            last_outcome=outcome or None,  # type: ignore[arg-type]
            last_ended_at=seconds(ended),
            skipped=fields.to_int(skipped, 0),
        )

    @staticmethod
    def _counts(row: list) -> dict[str, int]:
        return records.counts(row)
