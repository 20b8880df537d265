"""Fail handler: record each failed job, with its error, in a capped per-queue Redis list.

    queue.listen("myapp.jobs", fail_handler="queasy_py.handlers.dead_letter")

The list of queue `emails` is `QueueKeys(...).dead_letters` (newest first); read it with
`queasy_py.handlers.dead_letter.read(client.queue("emails"))`. It keeps the newest MAX_ENTRIES
(env QUEASY_DEAD_LETTER_MAX, default 10,000). It records only into the list of the queue its
fail queue belongs to; a record naming another queue is refused (PermanentError).
"""

from __future__ import annotations

import os
import time
from typing import Any

import orjson

from queasy_py import Job, Queue
from queasy_py.context import current_client

from ._fail_record import fail_record

MAX_ENTRIES = int(os.environ.get("QUEASY_DEAD_LETTER_MAX", "10000"))


def handle(data: list[Any], job: Job) -> None:
    # the queue comes from this fail job's own queue, never from the record (see _fail_record)
    original_data, original_job, error, name = fail_record(data, job)
    queue = current_client().queue(name)
    entry = orjson.dumps(
        {"data": original_data, "job": original_job, "error": error, "failed_at": time.time()}
    )
    with queue.client.redis.pipeline(transaction=True) as pipe:
        pipe.lpush(queue.keys.dead_letters, entry)
        pipe.ltrim(queue.keys.dead_letters, 0, MAX_ENTRIES - 1)
        pipe.execute()


def read(queue: Queue, count: int = 100) -> list[dict[str, Any]]:
    """The newest `count` dead letters of `queue`."""
    return [
        orjson.loads(raw)
        for raw in queue.client.redis.lrange(queue.keys.dead_letters, 0, count - 1)
    ]
