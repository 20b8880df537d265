"""What a job cannot break in its worker: the worker's own log lines (LogStream) and its
event loop (run_loop). A handler runs in the worker's process, with its streams and its loop
at hand; what it does to them must not stop the worker taking jobs."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("queasy_py.worker")


class LogStream(logging.StreamHandler):
    """The worker's own log lines, on a copy of fd 2 taken at start: a handler that closes
    sys.stderr or fd 2 does not silence them, and a line that cannot be written is lost,
    never raised (logging's handleError swallows OSError only: a closed file's ValueError
    came out of the worker's log calls and stopped the thread reading its pipe)."""

    def __init__(self) -> None:
        try:
            stream: Any = open(os.dup(2), "w", buffering=1, errors="backslashreplace")  # noqa: SIM115
        except OSError:  # no fd 2 at all
            stream = sys.stderr
        super().__init__(stream)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        try:
            super().handleError(record)
        except Exception:  # noqa: BLE001, S110 - nowhere left to say it
            pass


def run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The worker's event loop, for as long as the worker lives: a job cannot end it. A task
    a handler left behind that raises SystemExit or KeyboardInterrupt (asyncio lets those out
    of run_forever), or a handler's loop.stop(), ended its thread: every later async job of
    the worker then waited for its timeout."""
    while not loop.is_closed():
        try:
            loop.run_forever()
        except BaseException as exc:  # noqa: BLE001 - a job's, not the worker's
            log.error("a job's task raised %r out of the worker's event loop", exc)
        else:
            log.warning("a job stopped the worker's event loop; it goes on")
