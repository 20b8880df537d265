"""The supervisor's shutdown (runtime/supervisor.py's Supervisor inherits it): stop
dequeuing, wait for running jobs up to shutdown_timeout, hand back the rest (running jobs,
pushes held while liveness was unknown, twins), send the last acks within ACK_DEADLINE, and
leave each queue and the registry. A second signal skips a wait."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import redis

from ..store.library import fcall

if TYPE_CHECKING:
    from .supervisor import Supervisor

log = logging.getLogger("queasy_py")

#: seconds shutdown waits for its last acks to be accepted
ACK_DEADLINE = 10.0


class Shutdown:
    def _stop(self: Supervisor) -> None:
        self.stopping = True
        self.workers.stopping = True
        self.rounds.stopping = True

    def _shutdown(self: Supervisor) -> None:
        """Stop dequeuing, wait for running jobs up to shutdown_timeout, then hand back the rest."""
        self._stop()
        # the signals (or stop() calls) that started it: one (none after a fatal error); any
        # other, even one counted before this line (while the pushes stop), skips the wait
        first = min(self.signals, 1)
        try:
            self.rounds.unpark_all(self.client.id)
        except (redis.RedisError, OSError) as exc:  # it leaves at the end, which unparks too
            log.warning("could not stop pushes before shutting down: %s", exc)
        deadline = time.monotonic() + self.shutdown_timeout
        log.info(
            "shutting down: waiting up to %.3gs for %d running job(s)",
            self.shutdown_timeout,
            self.workers.running(),
        )
        while self.workers.running() and time.monotonic() < deadline:
            if self.signals > first:
                log.warning("second signal: not waiting for running jobs")
                break
            self._step()
        self.workers.hand_back_all()
        self._hand_back_held()
        self.rounds.checkouts.twins.release_all("the supervisor shut down")
        self._send_last_acks()
        for state in self.states.values():
            try:
                fcall(self.r, "queasy_leave", [state.base], ["", self.client.id])
            except (redis.RedisError, OSError):
                break
        try:
            self.registry.leave(self.r, self.client.id)
        except (redis.RedisError, OSError):
            pass  # its entry expires
        log.info("supervisor %s stopped", self.client.id)

    def _hand_back_held(self: Supervisor) -> None:
        """The pushes held while liveness was unknown (and any that arrived unread) go back
        as jobs never started ('return': nothing counted, as a dequeue reply during the
        drain), not left leased until a sweep counts a stall; none when this client was
        swept meanwhile (the sweep requeued them)."""
        held, self.held = self.held + self.wakeup.read(), []
        if not (self.heartbeat.swept.is_set() and self.heartbeat.swept_id == self.client.id):
            self.rounds.on_messages(held)  # stopping: each is returned (Checkouts._pushed)

    def _send_last_acks(self: Supervisor) -> None:
        rounds = self.rounds
        rounds.outage.retry_at = 0.0
        deadline = time.monotonic() + ACK_DEADLINE
        first = self.signals
        while (self.acks or rounds.pipe.inflight) and time.monotonic() < deadline:
            if self.signals > first:
                log.warning("another signal: not waiting for the last acks")
                break
            rounds.send()
            rounds.pipe.read(block=True)
            if self.acks:
                time.sleep(max(0.0, rounds.outage.retry_at - time.monotonic()))
        if self.acks:  # they are swept back with the client and run again: say which
            names = {state.base: name for name, state in self.states.items()}
            ids = [f"{names.get(ack.base, ack.base)}/{ack.args[0]}" for ack in self.acks]
            shown = ", ".join(ids[:20]) + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")
            log.error(
                "%d outcome(s) not acknowledged before the exit (Redis did not take them in "
                "%g s): these jobs will be swept back and run again: %s",
                len(ids),
                ACK_DEADLINE,
                shown,
            )
