"""What a worker does with a frame its supervisor sends that is not a batch of jobs (the
protocol: runtime/worker.py): "stop" ends it, "ping" is answered "pong" once the reader and
the event loop run; and the worker's exit at once, with every process under it, when its
supervisor is gone (its pipe closed, a send that fails, the parent died)."""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio
    import threading

    from .frames import Pipe

#: the frames of the supervisor that are not a batch of jobs, and the worker's answer
STOP = b'"stop"'
PING = b'"ping"'
PONG = b'"pong"'


def handled(
    frame: bytes, pipe: Pipe, send_lock: threading.Lock, loop: asyncio.AbstractEventLoop | None
) -> bool:
    """Whether `frame` was one of the supervisor's own (not jobs), handled: "stop" (sent only
    to a worker with no jobs left) exits; "ping" is answered from the event loop when there is
    one (a coroutine that never yields stops every async job: no answer then), else at once."""
    if frame == STOP:
        os._exit(0)
    if frame != PING:
        return False
    if loop is None:
        pong(pipe, send_lock)
    else:
        loop.call_soon_threadsafe(pong, pipe, send_lock)
    return True


def pong(pipe: Pipe, send_lock: threading.Lock) -> None:
    """Answer a ping: the reader got the GIL and the event loop (if any) its turn, so the
    worker's other jobs can go on (on the event loop when it has one)."""
    with send_lock:
        try:
            pipe.send_frame(PONG)
        except (OSError, ValueError):
            exit_with_everything()  # the supervisor is gone


def exit_with_everything() -> None:
    """Exit at once, taking every process a job started: those still under this worker
    (also in a session of their own) and, the worker being the leader of its own process
    group (pool.start_worker), the group: background children that init adopted too.
    A job spinning in pure Python holds the GIL for a switch interval (5 ms) each time this
    thread gives it up for a system call; the walk below makes hundreds of them (the import,
    a read per process in /proc), which took seconds: a short interval makes it milliseconds."""
    sys.setswitchinterval(1e-5)
    try:
        import psutil  # only on this path

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    except Exception:  # exit anyway
        pass
    if os.getpgrp() == os.getpid():
        os.killpg(0, signal.SIGKILL)
    os._exit(0)
