"""Quick start: dispatch jobs to an embedded Valkey server and run them to completion.

    python examples/quickstart.py

No Redis needed: Client() with no URL (and no $QUEASY_REDIS_URL) uses the project's embedded
server, starting it if no other queasy process of the project runs it; its data stays in
.queasy/ (a job left over from an interrupted run is run by the next one).
"""

from __future__ import annotations

import logging
import threading
import time

from queasy_py import Client
from queasy_py.handlers import dead_letter
from queasy_py.job import LIVE_STATES


def stop_when_idle(client: Client, queues: list, timeout: float = 60.0) -> None:
    """Stop the supervisor once every queue is empty (the example's end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(sum(q.counts()[s] for s in LIVE_STATES) == 0 for q in queues):
            break
        time.sleep(0.1)
    client.stop()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    with Client(workers=2) as client:
        emails = client.queue("emails")
        emails.listen("send_email", fail_handler="queasy_py.handlers.dead_letter", min_backoff=0.5)

        ids = emails.dispatch_many([{"data": {"to": f"user{i}@example.com"}} for i in range(10)])
        emails.dispatch({"to": "later@example.com"}, delay=1.0)
        emails.dispatch({"to": "bounce@example.com"}, id="bounce-1")
        print("dispatched:", len(ids) + 2, "jobs;", emails.counts())
        print("one of them:", emails.get_job(ids[0]))

        threading.Thread(
            target=stop_when_idle, args=(client, [emails, emails.fail_queue]), daemon=True
        ).start()
        client.run()  # blocks until stop() (or SIGTERM/SIGINT)

        print("after the run:", emails.counts())
        for letter in dead_letter.read(emails):
            print("dead letter:", letter["job"]["id"], letter["error"])


if __name__ == "__main__":
    main()
