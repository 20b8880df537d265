"""Workers started first: `Client.run()` starts its workers before it imports the rest of the
runtime, connects and loads the function library, and before the supervisor's first
heartbeat, so a worker's start (an interpreter importing queasy_py and its handlers,
about 0.1 s of CPU) overlaps all of that on the cores instead of following it.

The supervisor adopts them (Workers.adopt) when they were started for the handlers, result
queues and environment it would start its own with; it stops them otherwise. Until adopted,
`Early.close()` stops them (run() failed before its supervisor took them). They are started
exactly as Workers starts any worker (pool.start_worker: a fresh interpreter, its own
session, a socketpair): only the moment differs.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .. import defaults
from .pool import WorkerProc, start_worker

if TYPE_CHECKING:
    from ..client import Client
    from ..options import ListenOptions
    from ..queue import Queue

log = logging.getLogger("queasy_py")


def start_at_once() -> int:
    """How many workers start at a time: the core count (a start is CPU-bound)."""
    return max(1, os.cpu_count() or 1)


def queue_specs(client: Client) -> list[tuple[Queue, ListenOptions, str | None]]:
    """Every queue the supervisor of `client` runs, with its options and the key base of its
    fail queue (None: no fail handler): a listened queue's fail queue comes before it."""
    out: list[tuple[Queue, ListenOptions, str | None]] = []
    for queue, spec in client.listeners.values():
        fail_base = None
        if spec.fail_handler is not None:
            fail_queue = queue.fail_queue
            fail_base = fail_queue.keys.base
            out.append((fail_queue, spec.fail_spec(fail_queue.name), None))
        out.append((queue, spec, fail_base))
    return out


def worker_env(client: Client) -> dict[str, str]:
    """What a worker's environment adds to the supervisor's: the Redis URL and key prefix."""
    return {defaults.URL_ENV: client.url, defaults.PREFIX_ENV: client.prefix}


class Early:
    """Workers started for `handlers` ({queue: module path}), `results` (the queues that
    store results) and `env`, not yet adopted by a supervisor."""

    def __init__(
        self, handlers: dict[str, str], results: frozenset[str], env: dict[str, str]
    ) -> None:
        self.handlers = handlers
        self.results = results
        self.env = env
        self.procs: list[WorkerProc] = []

    def take(
        self, handlers: dict[str, str], results: frozenset[str], env: dict[str, str]
    ) -> list[WorkerProc]:
        """Hand the workers over when they were started for these handlers, results and
        environment; stop them otherwise (the caller starts its own). Either way they are
        no longer this object's."""
        if (handlers, results, env) != (self.handlers, self.results, self.env):
            log.debug("workers started first do not match the supervisor's: stopping them")
            self.close()
            return []
        procs, self.procs = self.procs, []
        return procs

    def close(self) -> None:
        """Stop the workers not handed over (their jobs: none, they were never sent any)."""
        procs, self.procs = self.procs, []
        for proc in procs:
            proc.kill()


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name} before the supervisor ran")


#: the signals that stop run() as SIGINT does where they are left at their default action
#: (which ends the process at once): SIGTERM, and SIGHUP (the terminal closed, an ssh session
#: dropped); an ignored SIGHUP (nohup) or a handler of the application's is left as it is
STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def stops_run(sig: int) -> bool:
    """Whether `sig` stops run() (the supervisor shuts down gracefully on it): SIGTERM and
    SIGINT always, SIGHUP while its action is the default (or run()'s own, below)."""
    if sig != signal.SIGHUP:
        return True
    return signal.getsignal(sig) in (signal.SIG_DFL, _interrupted)


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While run() holds workers no supervisor runs yet (from their start until the
    supervisor's own handlers are installed, and after it restored them): SIGTERM (and
    SIGHUP) raises KeyboardInterrupt as SIGINT does, so that run() stops them on its way
    out. By default SIGTERM ends the process at once, and a worker still importing its
    handlers outlived it (it exits on its closed pipe only once its imports are done: never,
    for one that hangs). Only in the main thread (where signals are handled) and only over
    the default action (a handler the application installed, an ignored SIGHUP, is left as
    it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    taken = [sig for sig in STOPPING_SIGNALS if signal.getsignal(sig) is signal.SIG_DFL]
    for sig in taken:
        signal.signal(sig, _interrupted)
    try:
        yield
    finally:
        for sig in taken:
            signal.signal(sig, signal.SIG_DFL)


def early_for(client: Client) -> Early:
    """The workers `client`'s supervisor will start first, none started yet (start_early)."""
    specs = queue_specs(client)
    handlers = {queue.name: spec.handler for queue, spec, _ in specs}
    results = frozenset(queue.name for queue, spec, _ in specs if spec.store_results)
    return Early(handlers, results, worker_env(client))


def start_early(client: Client, early: Early | None = None) -> Early:
    """Start the first workers of `client`'s supervisor now: as many as it starts at once
    (Workers.ensure: at most the core count), for the queues it listens to, into `early`
    (run() makes it first, so that an interrupt between the start and its try finds them)."""
    if early is None:
        early = early_for(client)
    workers = client.settings["workers"]
    target = workers if workers is not None else defaults.default_workers()
    try:
        for _ in range(min(target, start_at_once())):
            early.procs.append(start_worker(early.handlers, early.env, early.results))
    except BaseException:
        early.close()
        raise
    return early
