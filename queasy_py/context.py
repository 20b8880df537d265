"""Inside a handler: a producer Client on the supervisor's Redis, to dispatch follow-up jobs."""

from __future__ import annotations

import os
import threading

from . import defaults
from .client import Client
from .errors import QueasyError

_lock = threading.Lock()
_client: Client | None = None


def current_client() -> Client:
    """This worker's producer client (workers=0), made once per process.

    A supervisor gives its workers $QUEASY_REDIS_URL and $QUEASY_PREFIX; outside a worker
    those environment variables must be set by hand.
    """
    global _client
    with _lock:
        if _client is None:
            url = os.environ.get(defaults.URL_ENV)
            if not url:
                raise QueasyError(
                    f"current_client() needs ${defaults.URL_ENV} (set in worker processes)"
                )
            prefix = os.environ.get(defaults.PREFIX_ENV, defaults.PREFIX)
            _client = Client(url, workers=0, prefix=prefix)
        return _client
