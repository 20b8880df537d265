"""A periodic job that re-dispatches itself and survives crashes through the fail handler
queasy_py.handlers.reschedule (the lower-level recipe; examples/scheduled.py uses
listen(schedule=...)).

    python examples/periodic.py      # Ctrl-C to stop

The job `tick` dispatches its next run under its own id with update_run_at="if_earlier", so
dispatching it again (say, at every deploy) never makes two chains. If it fails for good
(or its worker keeps crashing), queasy_py.handlers.reschedule puts it back after a delay.
"""

from __future__ import annotations

import logging

from queasy_py import Client


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    with Client(workers=1) as client:
        ticks = client.queue("ticks")
        ticks.listen("tick", timeout=10.0, fail_handler="queasy_py.handlers.reschedule")
        ticks.dispatch({"n": 0, "every": 1.0}, id="tick", update_run_at="if_earlier")
        client.run()


if __name__ == "__main__":
    main()
