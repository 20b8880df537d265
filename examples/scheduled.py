"""A periodic job on a cron schedule: `report` runs every 5 seconds, on the clock.

    python examples/scheduled.py     # Ctrl-C to stop

listen(schedule=...) keeps one occurrence of the schedule in Redis (job id "schedule", data
{"fire_at": epoch seconds}); any number of supervisors running this share it, and none runs
a fire time twice. `schedule_every=5` would do the same without cron. The handler below is
this file's module (examples/ is on sys.path when it runs as a script).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from queasy_py import Client, Job


def handle(data: dict[str, Any], job: Job) -> None:
    late = time.time() - data["fire_at"]
    print(f"report for {time.strftime('%X', time.localtime(data['fire_at']))} (+{late:.3f}s)")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    with Client(workers=1) as client:
        client.queue("reports").listen("scheduled", schedule="*/5 * * * * *", max_retries=1)
        client.run()


if __name__ == "__main__":
    main()
