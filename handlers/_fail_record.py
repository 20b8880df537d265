"""The one rule of the ready-made fail handlers: act only on the queue the fail queue belongs to.

A fail job's data is `[original_data, original_job, error]`, written by the Lua library when
a job of queue Q fails for good, into Q's fail queue `Q + FAIL_QUEUE_SUFFIX`. Anyone who can
dispatch can also write a record straight into a fail queue, naming any queue: a handler
trusting `original_job["queue"]` would then dispatch into, or write the keys of, that queue.
So the queue is taken from the handler's own job (the fail queue it runs for), and a record
naming another queue, or not shaped like a fail record, is refused with a PermanentError.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from queasy_py import Job, PermanentError, defaults


class FailRecord(NamedTuple):
    data: Any
    job: dict[str, Any]
    error: dict[str, Any]
    queue: str  # the queue that failed: the fail queue's name without its suffix


def fail_record(data: Any, job: Job) -> FailRecord:
    """The checked fail record of a fail job; PermanentError (no retries) if it is not one."""
    suffix = defaults.FAIL_QUEUE_SUFFIX
    if not job.queue.endswith(suffix) or job.queue == suffix:
        raise PermanentError(
            f"{job.queue!r} is not a fail queue (no {suffix!r} suffix): a fail handler runs "
            "only as the fail_handler of a queue"
        )
    queue = job.queue[: -len(suffix)]
    if not isinstance(data, list) or len(data) != 3:
        raise PermanentError(f"fail job {job.id} of {job.queue}: data is not [data, job, error]")
    original_data, original_job, error = data
    if not isinstance(original_job, dict) or not isinstance(original_job.get("id"), str):
        raise PermanentError(f"fail job {job.id} of {job.queue}: the failed job has no str id")
    if original_job.get("queue") != queue:
        raise PermanentError(
            f"fail job {job.id} of {job.queue} names queue {original_job.get('queue')!r}; "
            f"the fail handler of {job.queue} acts on {queue!r} only"
        )
    return FailRecord(original_data, original_job, error if isinstance(error, dict) else {}, queue)
