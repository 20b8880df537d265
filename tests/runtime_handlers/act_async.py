"""An async handler: like act, but sleeps with asyncio on the worker's event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from tests.runtime_handlers import misbehave, record


async def handle(data: dict[str, Any], job: Any) -> None:
    loop_thread = threading.current_thread().name
    in_loop = asyncio.get_running_loop().is_running()
    record("start", data, job, units=data.get("units"), thread=loop_thread, in_loop=in_loop)
    await asyncio.sleep(misbehave(data, job))
    record("end", data, job, units=data.get("units"), thread=loop_thread)
