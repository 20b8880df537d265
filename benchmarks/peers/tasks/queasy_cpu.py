"""queasy_py handler for the CPU-bound scale benchmark (benchmarks/scale.py): `{"loops": n}`
spins a pure-Python loop of n iterations (holding the GIL the whole time; scale.py calibrates
n to ~20 ms on the machine), then counts itself done like every benchmark job."""

from . import _shared


def spin(loops: int) -> int:
    acc = 0
    for i in range(loops):
        acc = (acc + i * i) & 0xFFFFFFFF
    return acc


def handle(data, job):
    spin(int(data["loops"]))
    _shared.noop()
