"""Run one supervisor for the runtime tests: `python -m tests.supervisor_main CONFIG_JSON`.

CONFIG_JSON: {"url": ..., "prefix": ..., "workers": n, "settings": {Client keywords},
"queues": {name: {"handler": module path, **listen options}}, "sys_path": [entries put first
on sys.path once queasy_py is imported] (optional), "clock_skew": seconds added to this
process's time.time() (optional: a host whose clock is off; its workers keep the true
time), "clock_step": seconds added to it at each SIGUSR1 (optional: a host whose clock is
stepped, by NTP or a resumed VM, while it runs)}. Logs go to stderr; the exit code is
client.run()'s. tests/runtime_helpers.py starts it in a new session (process group).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time

from queasy_py import Client


def main(config: dict) -> int:
    logging.basicConfig(
        level=logging.DEBUG,
        stream=sys.stderr,
        format="%(asctime)s supervisor[%(process)d] %(levelname)s %(message)s",
    )
    logging.getLogger("redis").setLevel(logging.WARNING)
    sys.path[:0] = config.get("sys_path", [])
    skew = [float(config.get("clock_skew", 0.0))]
    if skew[0] or "clock_step" in config:
        true_time = time.time
        time.time = lambda: true_time() + skew[0]  # type: ignore[assignment]
    if "clock_step" in config:

        def step(signum: int, frame: object) -> None:
            skew[0] += float(config["clock_step"])

        signal.signal(signal.SIGUSR1, step)
    with Client(
        config["url"], config["workers"], prefix=config["prefix"], **config["settings"]
    ) as client:
        for name, options in config["queues"].items():
            options = dict(options)
            client.queue(name).listen(options.pop("handler"), **options)
        return client.run()


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
