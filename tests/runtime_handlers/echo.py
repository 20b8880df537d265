"""A handler that records a digest of the data it got (its JSON, keys sorted) and its size."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tests.runtime_handlers import record


def digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def handle(data: Any, job: Any) -> None:
    record("end", data, job, digest=digest(data), size=len(json.dumps(data)))
