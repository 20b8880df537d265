"""One bullmq worker process: Worker("bench", concurrency=10) until SIGTERM/SIGINT, then close().
bullmq (Python) has no worker CLI; its docs run a Worker inside your own asyncio program."""

import asyncio
import os
import signal
import sys

from bullmq import Worker

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tasks import _shared  # noqa: E402


async def process(job, token):
    if job.name == "stamp":
        await _shared.astamp(job.data["i"])
    else:
        await _shared.anoop()


async def main():
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    worker = Worker(
        "bench", process, {"connection": os.environ["BENCH_REDIS_URL"], "concurrency": 10}
    )
    await stop.wait()
    await worker.close()


if __name__ == "__main__":
    asyncio.run(main())
