"""A handler that does nothing at all (benchmarks/profile.py measures the runtime alone)."""


def handle(data, job):
    return None
