"""Fail handler: record each failed job, with its error, in a capped per-queue Redis list.

    queue.listen("myapp.jobs", fail_handler="queasy_py.handlers.dead_letter")

The list of queue `emails` is `QueueKeys(...).dead_letters` (newest first); read it with
`queasy_py.handlers.dead_letter.read(client.queue("emails"))`, and dispatch its jobs again
with `requeue(client.queue("emails"))` (`queasy requeue emails --failed`). It keeps the
newest MAX_ENTRIES (env QUEASY_DEAD_LETTER_MAX, default 10,000). It records only into the
list of the queue its fail queue belongs to; a record naming another queue is refused
(PermanentError).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from typing import Any

import orjson

from queasy_py import InvalidInput, Job, Queue, validate
from queasy_py.context import current_client

from ._fail_record import fail_record


def _max_entries() -> int:
    """QUEASY_DEAD_LETTER_MAX, checked at import (listen() imports it): 0 would be no cap."""
    raw = os.environ.get("QUEASY_DEAD_LETTER_MAX", "10000")
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidInput(f"QUEASY_DEAD_LETTER_MAX must be an int >= 1, not {raw!r}")
    return value


MAX_ENTRIES = _max_entries()
#: entries requeue() reads per LRANGE
CHUNK = 500


def handle(data: list[Any], job: Job) -> None:
    # the queue comes from this fail job's own queue, never from the record (see _fail_record)
    original_data, original_job, error, name = fail_record(data, job)
    queue = current_client().queue(name)
    letter = {"data": original_data, "job": original_job, "error": error, "failed_at": time.time()}
    try:
        entry = orjson.dumps(letter)
    except orjson.JSONEncodeError:  # data nested deeper than orjson writes (see _deep)
        entry = orjson.dumps({**letter, "data": _deep(original_data)})
    with queue.client.redis.pipeline(transaction=True) as pipe:
        pipe.lpush(queue.keys.dead_letters, entry)
        pipe.ltrim(queue.keys.dead_letters, 0, MAX_ENTRIES - 1)
        pipe.execute()


def _deep(data: Any) -> orjson.Fragment:
    """Job data nested deeper than orjson writes (a job written around the producer API: the
    library takes 1000 levels) as the JSON text the standard library writes of it: the
    letter is kept all the same (requeue() leaves it: no dispatch takes such data)."""
    return orjson.Fragment(json.dumps(data, separators=(",", ":")))


def read(queue: Queue, count: int = 100) -> list[dict[str, Any]]:
    """The dead letters among the newest `count` entries of `queue`'s list (`count` >= 1),
    newest first. An entry that is not a JSON object (written into the list by another
    hand) is left out, as requeue() leaves it: it does not stop the reading of the others."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidInput(f"count must be an int >= 1, not {count!r}")
    letters = []
    for raw in queue.client.redis.lrange(queue.keys.dead_letters, 0, count - 1):
        try:
            entry = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(entry, dict):
            letters.append(entry)
    return letters


def requeue(
    queue: Queue, ids: Iterable[str] | None = None, entries: int | None = None
) -> list[str]:
    """Dispatch the jobs of `queue`'s dead letters again, each with its data and id, and
    remove their entries: those of these job ids, or every entry. An id that has a live job
    (waiting, delayed, blocked or active: requeued from its kept failed record, or
    dispatched since), or whose job ended since the letter's failure (it finished, was
    cancelled, or a later run failed: it ran again already), keeps that one; its entries go
    all the same. An entry that is not a dead letter of this module, whose job's data was
    never read (InvalidJobData), or whose job cannot be dispatched (an id or data the
    library refuses), stays. Takes the entries there when it is called, oldest first, CHUNK
    at a time: a letter added meanwhile (a job requeued here that failed again) is not
    requeued by this call. `entries`: at most the oldest `entries` of them, those there
    when the caller counted them (pending()) before it requeued the jobs' kept failed
    records: a job requeued so that failed again meanwhile has a new letter, not taken.
    Returns the ids dispatched."""
    if isinstance(ids, str):
        raise InvalidInput("ids must be a list of job ids, not a str")
    if entries is not None and (isinstance(entries, bool) or not isinstance(entries, int)):
        raise InvalidInput(f"entries must be None or an int, not {entries!r}")
    wanted = None if ids is None else {validate.job_id(i) for i in ids}
    r, key = queue.client.redis, queue.keys.dead_letters
    dispatched: list[str] = []
    left = r.llen(key)  # the entries there now; new ones are pushed at the head
    if entries is not None:
        left = min(left, max(0, entries))
    stays = 0  # entries at the tail looked at and left in the list
    while left > 0:
        chunk = r.lrange(key, -stays - min(CHUNK, left), -stays - 1)
        if not chunk:
            return dispatched
        for raw in reversed(chunk):  # oldest first
            left -= 1
            job_id, data, run_at = _entry(raw)
            if job_id is None or (wanted is not None and job_id not in wanted):
                stays += 1
                continue
            try:  # the check of _still_failed and the dispatch in one library step
                if queue._dispatch_letter(data, job_id, _seconds(run_at)):
                    dispatched.append(job_id)
            except InvalidInput:
                stays += 1
                continue
            r.lrem(key, -1, raw)  # from the tail: this entry (those after it are gone or stay)
    return dispatched


def pending(queue: Queue) -> int:
    """How many entries `queue`'s list holds now (requeue()'s `entries`)."""
    return int(queue.client.redis.llen(queue.keys.dead_letters))


def _seconds(run_at: Any) -> float | None:
    """The run_at of a letter's failed run (seconds), or None when the letter has none: then
    any kept failed record may be its run's (the library's queasy_dispatch_letter decides, in
    one step: no job kept under the id, or the failed record of that very run)."""
    if isinstance(run_at, bool) or not isinstance(run_at, int | float):
        return None
    return run_at


def _entry(raw: bytes) -> tuple[str | None, Any, Any]:
    """(job id, data, run_at of the failed run) of a dead letter; (None, None, None) for an
    entry that is not one, and for the letter of a job whose stored data was not JSON
    (InvalidJobData): its data was never read, and the null recorded for it would requeue
    another job under its id."""
    try:
        entry = orjson.loads(raw)
        job_id = entry["job"]["id"]
        if entry["data"] is None and entry["error"].get("name") == "InvalidJobData":
            return None, None, None
        return validate.job_id(job_id), entry.get("data"), entry["job"].get("run_at")
    except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError, InvalidInput):
        return None, None, None
