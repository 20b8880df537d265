"""Schedules in the public API (issue #16): listen() and `queasy run` configs check them
(InvalidInput / ConfigError naming the queue and what is wrong), the fire-time grid and the
catch-up plan of runtime/schedules.py, and schedule_info() / Client.schedules() against a
real server."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
import redis
from lua_calls import Lua, schedule

from queasy_py import Client, ScheduleInfo
from queasy_py.aio import AsyncClient
from queasy_py.cli.config import parse
from queasy_py.errors import ConfigError, InvalidInput
from queasy_py.options import ListenOptions
from queasy_py.runtime.scheduler import QueueState
from queasy_py.runtime.schedules import ScheduleCheck, Seen, build
from queasy_py.store.keys import QueueKeys

HANDLER = "tests.runtime_handlers.act"


def ms(text: str) -> int:
    """ms since the epoch of an ISO time (UTC unless it says otherwise)."""
    at = datetime.fromisoformat(text)
    return int((at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() * 1000)


def spec(**options: object) -> ListenOptions:
    return ListenOptions.build("q", HANDLER, options, check=False)


# ---------------------------------------------------------------- what listen() refuses


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"schedule": "*/5 * * *"}, "is not a cron expression of 5 fields"),
        ({"schedule": "61 * * * *"}, "Bad minute"),
        ({"schedule": "* * * * * * *"}, "Wrong number of fields"),
        ({"schedule": "0 0 30 2 *"}, "Bad day-of-month"),
        ({"schedule": ""}, "schedule must be a cron expression"),
        ({"schedule": 5}, "schedule must be a cron expression"),
        ({"schedule_every": 0}, "schedule_every must be at least 0.001 s"),
        ({"schedule_every": -1}, "schedule_every must be >= 0"),
        ({"schedule_every": "60"}, "schedule_every must be a number of seconds"),
        ({"schedule_every": 1e12}, "schedule_every must be at most"),
        ({"schedule": "* * * * *", "schedule_every": 60}, "not both"),
        ({"schedule": "* * * * *", "timezone": "Mars/Olympus"}, "not a known IANA time zone"),
        ({"schedule": "* * * * *", "timezone": "Europe"}, "not a known IANA time zone"),
        ({"schedule": "* * * * *", "timezone": "America/Argentina"}, "not a known IANA time zone"),
        ({"schedule": "* * * * *", "timezone": "x" * 300}, "not a known IANA time zone"),
        ({"schedule_every": 60, "timezone": "Europe/Paris"}, "timezone is for a cron"),
        ({"timezone": "Europe/Paris"}, "timezone is for a cron"),
        ({"schedule_every": 60, "catch_up": "all"}, "catch_up must be one of"),
        ({"catch_up": "skip"}, "catch_up needs a schedule"),
    ],
)
def test_listen_refuses_a_bad_schedule_naming_the_queue(options: dict, says: str) -> None:
    with pytest.raises(InvalidInput) as info:
        spec(**options)
    assert "queue 'q'" in str(info.value) and says in str(info.value), info.value


def test_a_fail_queue_takes_no_schedule() -> None:
    with pytest.raises(InvalidInput, match="unknown fail_options key"):
        spec(fail_handler="queasy_py.handlers.dead_letter", fail_options={"schedule_every": 5})


def test_a_queasy_run_config_takes_the_schedule_keys_and_names_a_bad_one() -> None:
    keys = {"schedule": "0 9 * * MON-FRI", "timezone": "Europe/Paris", "catch_up": "skip"}
    config = parse({"queues": {"reports": {"handler": HANDLER, **keys}}}, "q.toml")
    assert config.queues["reports"] == (HANDLER, keys)
    with pytest.raises(ConfigError) as info:
        bad = {"handler": HANDLER, **keys, "schedule": "0 25 * * *"}
        parse({"queues": {"reports": bad}}, "q.toml")
    assert str(info.value).startswith("q.toml: queues.reports: queue 'reports': schedule")
    assert "Bad hour" in str(info.value)


# ---------------------------------------------------------------- the fire-time grid


def test_cron_fire_times_follow_the_expression_in_its_timezone() -> None:
    s = build("q", spec(schedule="0 9 * * MON-FRI", timezone="Europe/Paris"))
    assert s is not None and s.text == "cron 0 9 * * 1-5 Europe/Paris"  # one text per schedule
    friday = ms("2024-03-29T08:00:00")  # 09:00 in Paris (winter time)
    assert s.next_after(friday - 1) == friday
    assert s.next_after(friday) == ms("2024-04-01T07:00:00")  # Monday, summer time
    assert s.latest(friday + 5) == friday and s.latest(friday) == friday
    assert s.count(friday, ms("2024-04-06T00:00:00")) == 1 + 5


def test_seconds_cron_and_interval_fire_times() -> None:
    every_second = build("q", spec(schedule="*/2  * * * * *"))  # seconds first; spaces squeezed
    assert every_second is not None and every_second.text == "cron */2 * * * * * UTC"
    t = ms("2024-01-01T00:00:00")
    assert every_second.next_after(t) == t + 2000 and every_second.latest(t + 1999) == t
    assert every_second.count(t, t + 10_000) == 5
    every = build("q", spec(schedule_every=0.25))
    assert every is not None and every.text == "every 0.25s"
    assert (every.next_after(t + 1), every.latest(t + 249), every.count(t, t + 1000)) == (
        t + 250,
        t,
        4,
    )
    assert build("q", spec(schedule_every=300)).text == "every 300s"  # type: ignore[union-attr]
    assert build("q", spec()) is None


@pytest.mark.parametrize(
    ("cron", "zone", "fall_back"),
    [
        ("30 2 * * *", "Europe/Paris", "2024-10-27T01:00:00"),  # 02:00-03:00 twice
        ("30 1-3 * * *", "Europe/Paris", "2024-10-27T01:00:00"),
        ("*/15 * * * *", "Europe/Paris", "2024-10-27T01:00:00"),
        ("0 * * * *", "America/New_York", "2024-11-03T06:00:00"),  # 01:00-02:00 twice
        ("0 0 * * * *", "America/New_York", "2024-11-03T06:00:00"),
    ],
)
def test_fire_times_in_the_repeated_hour_of_a_fall_back(cron: str, zone: str, fall_back: str):
    """In the hour a fall-back repeats (a wall time seen twice, the second with fold=1) the
    grid is the one a forward walk gives: next_after is later, latest not later, and nothing
    between them is a fire time."""
    s = build("q", spec(schedule=cron, timezone=zone))
    assert s is not None
    start = ms(fall_back) - 3_600_000
    for t in range(start, start + 3 * 3_600_000, 7 * 60_000 + 13):
        after, before = s.next_after(t), s.latest(t)
        assert before <= t < after, (t, before, after)
        assert s.next_after(before) == after, (t, before, after)


def test_a_fixed_time_in_the_repeated_hour_fires_once_and_catches_up_from_it() -> None:
    s = build("q", spec(schedule="30 2 * * *", timezone="Europe/Paris"))
    assert s is not None
    first = ms("2024-10-27T00:30:00")  # 02:30 CEST; 02:30 CET (01:30Z) does not fire again
    inside = ms("2024-10-27T01:05:00")  # 02:05 CET, the second 02:05
    assert s.next_after(inside) == ms("2024-10-28T01:30:00")
    assert s.latest(inside) == first
    # every supervisor down from 02:45 CEST the day before: catch_up="once" runs 02:30 CEST
    plan = check("once", Seen(first - 86_400_000, s.text, first - 86_400_000, ""))
    plan.schedule = s
    assert plan.plan(inside)[:3] == (first, None, 0)


# ---------------------------------------------------------------- the catch-up plan


def check(catch_up: str, seen: Seen, **options: object) -> ScheduleCheck:
    options = {"schedule_every": 10, "catch_up": catch_up, **options}
    listen = spec(**options)
    state = QueueState("q", "b", QueueKeys("p", "q", "q"), listen, None)
    schedule = build("q", listen)
    assert schedule is not None
    plan = ScheduleCheck(state, schedule, 1.0)
    plan.seen = seen
    return plan


T = 1_700_000_000_000  # a multiple of 10 s


def test_plan_the_first_occurrence_is_the_next_fire_time() -> None:
    assert check("once", Seen()).plan(T + 3_000) == (T + 10_000, None, 0, 0)


@pytest.mark.parametrize("catch_up", ["once", "skip"])
def test_plan_on_time_the_next_comes_from_the_last_fire_time_not_now(catch_up: str) -> None:
    seen = Seen(T, "every 10s", T, "")  # ended at T + 9.5 s: the next is T + 10 s, not later
    assert check(catch_up, seen).plan(T + 9_500) == (T + 10_000, None, 0, 0)
    # a little late (within SCHEDULE_GRACE): still that fire time, it runs now
    assert check(catch_up, seen).plan(T + 10_900) == (T + 10_000, None, 0, 0)


def test_plan_once_runs_one_for_the_latest_missed_fire_time() -> None:
    ended = Seen(T, "every 10s", T, "")
    assert check("once", ended).plan(T + 45_000)[:3] == (T + 40_000, None, 3)  # 10, 20, 30
    pending = Seen(T, "every 10s", None, "waiting")  # nothing ran it: moved to the latest
    assert check("once", pending).plan(T + 45_000) == (T + 40_000, T + 40_000, 3, 4)
    # late by less than a fire time: it runs late, not moved
    assert check("once", pending).plan(T + 5_000)[1] is None


def test_plan_skip_goes_to_the_next_fire_time() -> None:
    ended = Seen(T, "every 10s", T, "")
    assert check("skip", ended).plan(T + 45_000)[:3] == (T + 50_000, None, 4)
    pending = Seen(T, "every 10s", None, "waiting")
    assert check("skip", pending).plan(T + 5_000) == (T + 10_000, T + 10_000, 0, 1)
    assert check("skip", pending).plan(T + 500)[1] is None  # within the grace


def test_plan_a_changed_schedule_moves_the_pending_occurrence() -> None:
    pending = Seen(T + 3_600_000, "every 3600s", T, "waiting")
    assert check("once", pending).plan(T + 1_000) == (T + 3_610_000, T + 10_000, 0, 0)


def test_a_running_occurrence_far_past_its_fire_time_costs_each_check_only_the_new_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A per-second cron whose occurrence runs for 2 h: every check (each poll_interval)
    counts the fire times it would pass over; walking all 7200 again at each check took the
    supervisor's loop ~1 s of every second. It goes on from the last count instead."""
    plan = check("skip", Seen(), schedule="* * * * * *", schedule_every=None)
    start = T - 2 * 3_600_000
    plan.seen = Seen(start, plan.schedule.text, None, "active")
    first = plan.plan(T)
    assert first[2] == 2 * 3600  # the fire times after `start` up to T + 1 s passed over
    steps = 0
    walk = type(plan.schedule).next_after

    def counted(self: object, ms: int) -> int:
        nonlocal steps
        steps += 1
        return walk(self, ms)  # type: ignore[arg-type]

    monkeypatch.setattr(type(plan.schedule), "next_after", counted)
    later = plan.plan(T + 1_000)  # the next check, a poll later
    assert later[2] == first[2] + 1
    assert steps < 20, steps
    # and the counts agree with a fresh one
    assert build("q", spec(schedule="* * * * * *")).count(start + 1_000, T + 2_000) == later[2]


# ---------------------------------------------------------------- reading it back


@pytest.fixture
def client(redis_url: str, prefix: str):
    with Client(redis_url, workers=0, prefix=prefix) as c:
        yield c


def test_schedule_info_and_schedules_read_what_the_library_stored(
    client: Client, r: redis.Redis, prefix: str, redis_url: str
) -> None:
    soon = int(datetime.now(UTC).timestamp() * 1000) + 60_000
    schedule(Lua(r, prefix, "reports"), None, soon, spec="cron 0 9 * * * UTC")
    schedule(Lua(r, prefix, "ticks"), None, soon, spec="every 1s")
    Lua(r, prefix, "plain").take("x:schedule")  # a job key ending in ':schedule'
    Lua(r, prefix, "plain").add("schedule")  # a job named like an occurrence, no schedule
    info = client.queue("reports").schedule_info()
    spec = "cron 0 9 * * * UTC"
    assert info == ScheduleInfo("reports", spec, soon / 1000, "delayed", None, None, None, 0)
    assert info is not None and info.next_fire_at == soon / 1000
    assert client.queue("plain").schedule_info() is None
    assert list(client.schedules()) == ["reports", "ticks"]
    assert client.schedules()["ticks"].spec == "every 1s"

    async def read() -> ScheduleInfo | None:
        async with AsyncClient(redis_url, prefix=prefix) as aclient:
            return await aclient.queue("reports").schedule_info()

    assert asyncio.run(read()) == info


def test_drop_schedule_cancels_the_pending_occurrence_and_drops_the_record(
    client: Client, r: redis.Redis, prefix: str, redis_url: str
) -> None:
    """Queue.drop_schedule / AsyncQueue.drop_schedule (library 4.4.0): before, nothing
    removed a schedule's record, so one taken out of the config was listed for good."""
    soon = int(datetime.now(UTC).timestamp() * 1000) + 60_000
    for name in ("reports", "ticks"):
        schedule(Lua(r, prefix, name), None, soon, spec="every 3600s")
    assert client.queue("reports").drop_schedule() is True
    assert client.queue("reports").schedule_info() is None
    assert client.queue("reports").drop_schedule() is False
    assert list(client.schedules()) == ["ticks"]
    client.queue("reports").dispatch({}, id="schedule")  # a plain id again

    async def drop() -> tuple[bool, bool]:
        async with AsyncClient(redis_url, prefix=prefix) as aclient:
            q = aclient.queue("ticks")
            return await q.drop_schedule(), await q.drop_schedule()

    assert asyncio.run(drop()) == (True, False)
    assert client.schedules() == {}
    job = client.queue("ticks").get_job("schedule")
    assert job is not None and job.state == "cancelled"


@pytest.mark.parametrize(
    "spellings",
    [
        ("0 9 * * MON-FRI", "0 9 * * mon-fri", "0 9 * * 1-5", "0  9 * *  1,2,3-5"),
        (
            "*/5 * * * *",
            "0/5 * * * *",
            "0-59/5 * * * *",
            "0,5,10,15,20,25,30,35,40,45,50,55 * * * *",
        ),
        ("0 0 * * 0", "0 0 * * 7", "0 0 * * SUN", "0 0 * * sun"),
        ("0 0 1 JAN,feb *", "0 0 1 1-2 *", "0 0 1 2,1 *"),
        ("*/30 * * * *", "0,30 * * * *"),
        ("*/20 * * * * *", "0/20 * * * jan-dec *", "0,20,40 * * * * *"),
        ("0 12 * * 0-7", "0 12 * * SUN-SAT", "0 12 * * 0-6"),
        ("0 0 * * 5L", "0 0 * * 5l"),
    ],
)
def test_one_schedule_spelled_several_ways_has_one_text(spellings: tuple[str, ...]) -> None:
    """The library tells a changed schedule by its text: every spelling of one makes one."""
    texts = {build("q", spec(schedule=s)).text for s in spellings}  # type: ignore[union-attr]
    assert len(texts) == 1, texts


@pytest.mark.parametrize(
    "a, b",
    [
        # cronsim's Debian-cron DST handling is on in a 5-field expression whose minute and
        # hour both start with no `*`: these are two schedules in a zone with DST
        ("*/5 9 * * *", "0/5 9 * * *"),
        ("0 */2 * * *", "0 0-23/2 * * *"),
        # day-of-month and day-of-week both restricted: either matches (a `*` makes it both)
        ("0 0 */2 * 1", "0 0 1/2 * 1"),
        ("0 0 * * *", "0 0 0 * * *"),  # 6 fields: no DST handling
    ],
)
def test_schedules_the_parser_tells_apart_keep_two_texts(a: str, b: str) -> None:
    first, second = build("q", spec(schedule=a)), build("q", spec(schedule=b))
    assert first is not None and second is not None and first.text != second.text


def test_the_canonical_text_is_read_as_the_same_schedule_and_is_stable() -> None:
    from queasy_py.runtime.crontext import _meaning, _sim, canonical

    fields = (
        ["*", "0", "*/15", "5-10", "1,3,7", "0/20", "30"],
        ["*", "0", "*/2", "9-17", "0/6", "1,13"],
        ["*", "1", "*/2", "1/2", "L", "LW", "1,15", "10-20"],
        ["*", "1", "JAN-MAR", "*/3", "dec"],
        ["*", "0", "7", "MON-FRI", "1#2", "5L", "*/2", "sun,sat"],
    )
    import itertools

    for minute, hour, day, month, weekday in itertools.product(*fields):
        for expression in (f"{minute} {hour} {day} {month} {weekday}",
                           f"0 {minute} {hour} {day} {month} {weekday}"):  # fmt: skip
            try:
                sim = _sim(expression)
            except Exception:  # noqa: BLE001 - a combination cronsim refuses
                continue
            text = canonical(expression)
            assert _meaning(_sim(text), text) == _meaning(sim, expression), expression
            assert canonical(text) == text, expression


@pytest.mark.parametrize(
    "expression",
    [
        "0/3,1/3 0/3,1/3 0/3,1/3 * * *",  # 30 characters; its runs written out: 272
        "0/3,1/3 0/3,1/3 0/2,1/3 1/3 * *",
    ],
)
def test_a_short_schedule_whose_canonical_text_is_long_is_not_refused_as_too_long(
    expression: str, client: Client, r: redis.Redis, prefix: str
) -> None:
    """The canonical text writes each field's values out as runs: a short expression built of
    steps (`0/3,1/3`) has a far longer one. It is a schedule cronsim accepts and that fit the
    library's 200 bytes as written: listen() takes it, and the library stores its text."""
    from queasy_py.runtime.crontext import _meaning, _sim

    made = build("q", spec(schedule=expression))
    assert made is not None and made.cron is not None
    assert len(made.text.encode()) <= 200
    assert _meaning(_sim(made.cron), made.cron) == _meaning(_sim(expression), expression)
    assert build("q", spec(schedule=f"  {expression} ")).text == made.text  # type: ignore[union-attr]
    client.queue("q").counts()  # the library loaded
    fire_at = made.next_after(int(datetime.now(UTC).timestamp() * 1000))
    assert schedule(Lua(r, prefix, "q"), None, fire_at, spec=made.text).code == 2  # CREATED


def test_a_schedule_text_over_the_librarys_200_bytes_is_refused_by_listen(
    client: Client, r: redis.Redis, prefix: str
) -> None:
    """The library counts a schedule's text in bytes (MAX_SPEC). cronsim reads `ſun` as `SUN`
    (str.upper), and an expression it cannot write canonically (`*/5,7` in day-of-month) is
    kept as written: 196 characters but 240 bytes. listen() must refuse it, naming it too
    long, not leave every supervisor's schedule check to fail at the library."""
    expression = "0 0 */5,7 * " + ",".join(["ſun"] * 44)
    with pytest.raises(InvalidInput, match="is too long"):
        build("q", spec(schedule=expression))
    client.queue("q").counts()  # the library loaded: it refuses that text
    with pytest.raises(redis.ResponseError, match="spec must be"):
        schedule(Lua(r, prefix, "q"), None, 2**41, spec=f"cron {expression} UTC")


def test_a_timezone_that_names_the_hosts_zone_is_refused() -> None:
    """`localtime` passes zoneinfo (/usr/share/zoneinfo/localtime links to /etc/localtime)
    but names each host's own zone: supervisors on hosts in different zones stored one text
    (`cron 0 9 * * * localtime`) and computed two grids of fire times for it, each creating
    the next occurrence from the other's fire time on its own grid (two runs a day)."""
    with pytest.raises(InvalidInput) as info:
        spec(schedule="0 9 * * *", timezone="localtime")
    assert "queue 'q'" in str(info.value) and "'localtime'" in str(info.value), info.value
    assert "host" in str(info.value)


@pytest.mark.parametrize("cron", ["0 9 15W * *", "0 9 W * *", "0 9 1W,15 * *"])
def test_a_nearest_weekday_other_than_lw_is_refused_naming_the_field(cron: str) -> None:
    """cronsim reads `W` only as `LW` (README: `L`, `LW`, `#`): `15W` is a bad day-of-month,
    said at listen(), not a schedule that silently fires on other days."""
    with pytest.raises(InvalidInput, match="Bad day-of-month"):
        spec(schedule=cron)
    assert build("q", spec(schedule="0 9 LW * *")) is not None
