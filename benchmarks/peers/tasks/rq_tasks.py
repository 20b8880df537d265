"""rq jobs."""

from tasks import _shared


def noop():
    _shared.noop()


def stamp(i):
    _shared.stamp(i)
