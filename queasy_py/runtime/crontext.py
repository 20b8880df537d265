"""One text per cron schedule: the canonical form of a cron expression (runtime/schedules.py).

The library compares a schedule's text with the one it stored to tell a changed schedule (whose
pending occurrence then moves) from the same one; so two spellings of one schedule (`MON-FRI`
and `mon-fri` or `1-5`, `0-59/5` and `0/5`, `JAN` and `1`, `7` and `0` for Sunday) must make one
text, or a rolling deploy of supervisors spelling it two ways moves a late pending occurrence.

Each field is written from the set of values the cron parser (cronsim) reads from it: names as
numbers, Sunday as 0, lists sorted with runs as ranges, even steps as `*/k` or `a/k`. What the
parser reads from the text itself is kept: whether the day-of-month and day-of-week fields start
with `*` (both restricted: either matches; else both must), whether minute and hour do in a
5-field expression (its Debian-cron handling of a DST change), and the number of fields. The
form is checked: the parser must read the same schedule from it, else the expression is kept as
written (one schedule then has two texts, as before).
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

#: (low, high) of each field of a 6-field expression: second, minute, hour, day, month, weekday
RANGES = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
#: cronsim's markers of `L` and `LW` in the day-of-month field
LAST, LAST_WEEKDAY = -1000, -1001
SECOND, MINUTE, HOUR, DAY, MONTH, WEEKDAY = range(6)


def canonical(expression: str) -> str:
    """The canonical text of a cron expression cronsim accepts (`expression` when none is
    found that it reads as the same schedule)."""
    sim = _sim(expression)
    five = len(expression.split()) == 5
    stars = [part.startswith("*") for part in sim.parts]
    # per field: True/False where its leading `*` (or none) must stay, None where it may go
    want: list[bool | None] = [None, None, None, stars[DAY], None, stars[WEEKDAY]]
    if five and not (stars[MINUTE] or stars[HOUR]):  # DST handling on: no `*` on either
        want[MINUTE] = want[HOUR] = False
    elif five:  # off: one `*` kept (the hour's, where both have one) keeps it off
        want[HOUR if stars[HOUR] else MINUTE] = True
    fields = [_field(sim, n, want[n]) for n in range(6)]
    if None in fields:
        return expression
    text = " ".join(fields[1:] if five else fields)  # type: ignore[arg-type]
    try:
        same = _meaning(_sim(text), text) == _meaning(sim, expression)
    except Exception:  # noqa: BLE001 - a form the parser refuses: kept as written
        same = False
    return text if same else expression


@functools.lru_cache(maxsize=64)
def canonical_or_none(expression: str) -> str | None:
    """canonical(expression), None for one cronsim refuses (a stored text is read back)."""
    try:
        return canonical(expression)
    except Exception:  # noqa: BLE001 - any refusal: not a schedule this one spells
        return None


def _sim(expression: str) -> Any:
    from cronsim import CronSim

    return CronSim(expression, datetime(2000, 1, 1, tzinfo=UTC))


def _meaning(sim: Any, expression: str) -> tuple:
    """What cronsim reads from an expression: its sets and the flags its text sets."""
    fixup = len(expression.split()) == 5 and not (
        sim.parts[MINUTE].startswith("*") or sim.parts[HOUR].startswith("*")
    )
    weekdays = {(w[0] % 7, w[1]) if isinstance(w, tuple) else w % 7 for w in sim.weekdays}
    sets = (sim.seconds, sim.minutes, sim.hours, sim.days, sim.months, weekdays)
    return (*(frozenset(s) for s in sets), sim.day_and, fixup)


def _field(sim: Any, n: int, star: bool | None) -> str | None:
    """Field `n` from its set: starting with `*` (star True), not (False), or either (None,
    the parser reads no difference: `*` forms preferred). None when no text fits."""
    low, high = RANGES[n]
    raw = (sim.seconds, sim.minutes, sim.hours, sim.days, sim.months, sim.weekdays)[n]
    plain = {v for v in raw if isinstance(v, int) and v >= 0}
    if star is not False and plain == raw:
        if plain == set(range(low, high + 1)):
            return "*"
        step = _step(plain, low, high)
        if step and (star or len(plain) >= 3):
            return f"*/{step}"
        if star and plain == {low}:
            return f"*/{high - low + 1}"
    if star:
        return None  # a `*` field the forms above cannot write (`*/5,7`): kept as written
    if n == WEEKDAY:
        plain, high = {v % 7 for v in plain}, 6
    step = _step(plain, min(plain), high) if plain else 0
    if step and len(plain) >= 3:
        return f"{min(plain)}/{step}"
    parts = _runs(sorted(plain)) if plain else []
    if n == DAY:
        parts += [name for marker, name in ((LAST, "L"), (LAST_WEEKDAY, "LW")) if marker in raw]
    if n == WEEKDAY:
        special = sorted({(w[0] % 7, w[1]) for w in raw if isinstance(w, tuple)})
        parts += [f"{d}L" if nth == LAST else f"{d}#{nth}" for d, nth in special]
    return ",".join(parts)


def _step(values: set[int], start: int, high: int) -> int:
    """k >= 2 when `values` are start, start + k, ... up to `high`; else 0."""
    ordered = sorted(values)
    if len(ordered) < 2 or ordered[0] != start:
        return 0
    step = ordered[1] - ordered[0]
    return step if step >= 2 and values == set(range(start, high + 1, step)) else 0


def _runs(values: list[int]) -> list[str]:
    """Sorted values as `a-b` for each run of consecutive ones, `a` for a lone one."""
    out: list[str] = []
    first = last = values[0]
    for v in values[1:]:
        if v == last + 1:
            last = v
            continue
        out.append(str(first) if first == last else f"{first}-{last}")
        first = last = v
    out.append(str(first) if first == last else f"{first}-{last}")
    return out
