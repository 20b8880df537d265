"""queasy_py handler for the benchmark queue: `{"i": k}` records its start time (latency jobs);
every job then increments the completion counter."""

from . import _shared


def handle(data, job):
    if isinstance(data, dict) and "i" in data:
        _shared.stamp(data["i"])
    else:
        _shared.noop()
