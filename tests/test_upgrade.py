"""Library 4.1.0 over the stored state of 3.0.0 and 4.0.0: nothing is lost (issue 14's layout
changes).

3.x kept an active job's lease in its record (client, token, leased_at, attempts counting the
lease) and its lease token alone in B:lease:<client>, and wrote each outcome event as 16
fields. 4.0.0 keeps the lease, "<token> <leased_at>", in B:lease:<client> only, the record as
it was while waiting, and an event as one line. These tests build the state with the real
3.0.0 library (tests/fixtures/queasy-3.0.0.lua, the file as released), load 4.0.0 over it
as a supervisor's handshake does, and carry every job on (now 4.1.0, which reads all of 4.0.0's
state). 4.1.0's lease also holds the numbers of the record it leases, which an ack reads
instead of the record: 4.0.0's leases are acked from their records (tests/fixtures/
queasy-4.0.0.lua, the file as released).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from queasy_py.store.embedded import EmbeddedServer
from queasy_py.store.library import bundled_version, ensure_loaded, parse_version
from tests.lua_calls import NOW, Leased, Lua, schedule, schedule_info

FIXTURES = Path(__file__).parent / "fixtures"


def loaded(server: EmbeddedServer, version: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(server.url, decode_responses=True)
    conn.flushall()
    conn.function_load((FIXTURES / f"queasy-{version}.lua").read_text(), replace=True)
    assert conn.fcall("queasy_library", 0) == f"queasy_py {version}"
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def r(own_server: EmbeddedServer) -> Iterator[redis.Redis]:
    yield from loaded(own_server, "3.0.0")


@pytest.fixture
def r4(own_server: EmbeddedServer) -> Iterator[redis.Redis]:
    yield from loaded(own_server, "4.0.0")


@pytest.fixture
def r41(own_server: EmbeddedServer) -> Iterator[redis.Redis]:
    yield from loaded(own_server, "4.1.0")


def upgrade(r: redis.Redis, *queues: Lua) -> None:
    """Load the bundled library as every client's handshake does (the older one is replaced),
    and convert the keys of `queues` into its layout (5.0: what queasy_py does when a read
    is refused with TRYAGAIN upgrading; a write call converts by itself)."""
    ensure_loaded(r)
    assert parse_version(bundled_version()) >= (4, 1, 0)
    assert r.fcall("queasy_library", 0) == "queasy_py " + bundled_version()
    for lua in queues:
        for _ in range(100):
            if lua.call("queasy_upgrade", [lua.B], NOW) == 0:
                break


#: the last library of major version 4: the tests of what minor versions of 4 guarantee
#: each other (a process of one beside those of another, loaded back) load it as "the
#: newer" (5.0.0, a major, keeps its records in another layout: tests/test_upgrade_5.py)
LAST_4 = "4.4.0"


def upgrade_4(r: redis.Redis) -> None:
    """Load library LAST_4 over an older 4.x, as its handshake did."""
    r.function_load((FIXTURES / f"queasy-{LAST_4}.lua").read_text(), replace=True)
    assert r.fcall("queasy_library", 0) == f"queasy_py {LAST_4}"


def test_leases_taken_by_3_are_acked_read_and_swept_under_4(r: redis.Redis) -> None:
    lua = Lua(r, "up")
    lua.dispatch(*[(id, f'"{id}"', "") for id in "abcde"])
    a, b, c = lua.dequeue("c1", limit=3).jobs
    lua.add("a", '"blocked a"')  # blocked behind the active a
    (d,) = lua.dequeue("dead", limit=1, expiry=1_000).jobs
    assert lua.finish("c1", d, token="wrong") == 1  # (stale: nothing changes)
    assert r.hget(lua.B + ":active:b", "token") == b.token  # the layout of 3.x
    upgrade(r, lua)

    # read: a lease of 3.x shows as before
    rec = lua.record("b")
    assert rec is not None and rec["state"] == "active"
    assert (rec["client"], rec["leased_at"], rec["attempts"]) == ("c1", str(NOW), "1")
    assert dict(zip(*[iter(lua.call("queasy_leases", [lua.B], NOW, "c1"))] * 2, strict=True)) == {
        "a": a.token, "b": b.token, "c": c.token,
    }  # fmt: skip
    # acked: finish promotes the blocked a; the end counts the lease of 3.x once
    assert lua.finish("c1", a, now=NOW + 10) == 0
    assert lua.record("a")["state"] == "waiting"
    assert r.hget(lua.B + ":ends", "a").split(" ")[4] == "1"
    # retried: back to waiting with the lease fields of 3.x gone, attempts 1
    assert lua.retry("c1", b, run_at=NOW + 20, now=NOW + 10) == 0
    # (5.0: one record string in B:rec, "<run_at> <enqueued_at> <counts...> <attempts>\t...")
    assert not r.exists(lua.B + ":job:b", lua.B + ":active:b")
    assert r.hget(lua.B + ":rec", "b").split("\t")[0].split(" ")[5] == "1"
    # failed: its record is kept whole, with the lease's time and count
    assert lua.fail("c1", c, now=NOW + 10) == 0
    failed = lua.record("c")
    assert (failed["state"], failed["attempts"], failed["leased_at"]) == ("failed", "1", str(NOW))
    # swept: the dead client's job of 3.x goes back to waiting, stalled once
    checkout = lua.dequeue("c2", limit=10, now=NOW + 5_000)
    assert sorted(checkout.ids) == ["a", "b", "d", "e"]
    assert {job.id: job.stall_count for job in checkout.jobs}["d"] == 1
    # leased again under 4.0.0: attempts count both leases
    assert lua.record("b", now=NOW + 5_000)["attempts"] == "2"
    assert lua.record("d", now=NOW + 5_000)["attempts"] == "2"
    assert lua.record("e", now=NOW + 5_000)["attempts"] == "1"
    outcomes = [(e["id"], e["outcome"]) for e in lua.events()]
    assert outcomes == [("a", "finished"), ("b", "retried"), ("c", "failed"), ("d", "stalled")]


def test_events_of_3_stay_readable_after_the_upgrade(r: redis.Redis) -> None:
    lua = Lua(r, "up")
    lua.dispatch(("x", "1", ""), ("y", "2", ""))
    x, y = lua.dequeue("c1", limit=2).jobs
    assert lua.finish("c1", x, now=NOW + 1) == 0
    assert len(r.xrange(lua.B + ":events")[0][1]) == 16  # 3.x: 16 fields
    upgrade(r, lua)
    assert lua.finish("c1", y, now=NOW + 2) == 0
    old, new = lua.events()
    assert set(old) == set(new) and (old["id"], new["id"]) == ("x", "y")
    assert (old["outcome"], old["client"], new["outcome"], new["client"]) == (
        "finished", "c1", "finished", "c1",
    )  # fmt: skip


def test_blocked_updates_and_a_schedule_of_3_carry_on_under_4(r: redis.Redis) -> None:
    """What test_leases_... leaves out: a blocked copy holding pending updates (u_data,
    u_run_at, u_reset) behind a job leased by 3.x, merged when that job is retried or ends
    under 4.0.0; a schedule's occurrence leased by 3.x, its end noted under 4.0.0; and the
    retention of the ends 3.x kept."""
    lua = Lua(r, "up")
    lua.dispatch(("a", '"a"', ""), ("b", '"b"', ""), ("done", '"d"', ""))
    sched = schedule(lua, None, NOW)
    taken = lua.dequeue("c1", limit=5).jobs
    assert sorted(j.id for j in taken) == ["a", "b", "done", "schedule"]
    (done,) = [j for j in taken if j.id == "done"] or [None]
    a = lua.record("a")
    assert done is not None and a is not None and a["state"] == "active"
    leases = dict(zip(*[iter(lua.call("queasy_leases", [lua.B], NOW, "c1"))] * 2, strict=True))
    assert lua.finish("c1", done, now=NOW + 1) == 0  # an end kept by 3.x (B:ends)
    ended_by_3 = r.hget(lua.B + ":ends", "done")
    # pending updates of the active a (data, run_at, a reset of its counts) and b (its
    # run_at only, if earlier)
    lua.dispatch(("a", '"a2"', NOW + 50))
    lua.dispatch(("b", '"b2"', NOW + 70), update_data=False, run_at_mode="if_earlier")
    assert lua.counts()["blocked"] == 2
    pending = r.hgetall(lua.B + ":job:a")
    assert pending.get("u_data") == "1", pending  # the layout of 3.x
    upgrade(r, lua)

    assert r.hget(lua.B + ":ends", "done") == ended_by_3
    assert lua.record("done")["state"] == "finished"
    # a retried under 4.0.0: one record of a, with the blocked copy's data and run_at, its
    # counts reset by the update
    ja = Leased("a", leases["a"], '"a"', NOW, 0, 0, 0)
    assert lua.retry("c1", ja, run_at=NOW + 500, now=NOW + 10) == 0
    assert lua.get_job("a", now=NOW + 10) == {
        "state": "delayed", "id": "a", "data": '"a2"', "run_at": NOW + 50,
        "retry_count": 0, "stall_count": 0, "timeout_count": 0,
    }  # fmt: skip
    # b finished under 4.0.0: its blocked copy becomes the job, as 3.0.0 makes it (its own
    # data and run_at)
    jb = Leased("b", leases["b"], '"b"', NOW, 0, 0, 0)
    assert lua.finish("c1", jb, now=NOW + 10) == 0
    rec_b = lua.get_job("b", now=NOW + 10)
    assert rec_b is not None and rec_b["state"] in ("waiting", "delayed"), rec_b
    assert rec_b["data"] == '"b2"' and rec_b["run_at"] == NOW + 70
    assert lua.counts(now=NOW + 10)["blocked"] == 0
    assert not r.hexists(lua.B + ":blocked", "a") and not r.exists(lua.B + ":job:a")  # (5.0)
    # the schedule's occurrence, leased by 3.x, ends under 4.0.0 and is noted
    assert sched.fire_at == NOW
    (occ,) = [j for j in taken if j.id == "schedule"]
    assert lua.finish("c1", occ, now=NOW + 110) == 0
    info = schedule_info(lua, now=NOW + 110)
    assert info is not None and info["last_outcome"] == "finished", info


def test_leases_taken_by_4_are_acked_read_and_swept_under_4_1(r4: redis.Redis) -> None:
    """4.0.0's lease, "<token> <leased_at>", holds no numbers: under 4.1.0 an ack of it
    reads the job's record (as 4.0.0 did), and writes the same event and end; a lease taken
    under 4.1.0 to 5.0.0 holds them (5.1.0's does not: its ack reads the record)."""
    r = r4
    lua = Lua(r, "up")
    lua.dispatch(*[(id, f'"{id}"', "") for id in "abcdef"])
    (first,) = lua.dequeue("c1", limit=1).jobs
    assert lua.retry("c1", first, run_at=NOW, kind="timeout") == 0  # a timed out once
    a, b, c, d = lua.dequeue("c1", limit=4).jobs
    assert [a.id, b.id, c.id, d.id] == ["a", "b", "c", "d"] and a.timeout_count == 1
    (e,) = lua.dequeue("dead", limit=1, expiry=1_000).jobs
    assert r.hget(lua.B + ":lease:c1", "b") == f"{b.token} {NOW}"  # the layout of 4.0.0
    upgrade(r, lua)

    # read: as before
    rec = lua.record("a")
    assert (rec["state"], rec["client"], rec["leased_at"], rec["attempts"]) == (
        "active", "c1", str(NOW), "2",
    )  # fmt: skip
    # finished: the event and the end from the record, as 4.0.0 writes them
    assert lua.finish("c1", a, now=NOW + 10) == 0
    assert lua.finish("c1", b, now=NOW + 10) == 0
    lines = [f["event"] for _, f in r.xrange(lua.B + ":events")][-2:]
    assert lines == [
        f"finished a {NOW + 10} {NOW + 5} 42 {NOW} {NOW} 0 0 1 c1",
        f"finished b {NOW + 10} {NOW + 5} 42 {NOW} {NOW} 0 0 0 c1",
    ]  # fmt: skip
    assert r.hget(lua.B + ":ends", "a").split(" ")[4] == "2"
    assert r.exists(lua.B + ":ended:a") == 1 and r.exists(lua.B + ":ended:b") == 0
    assert lua.record("a")["leased_at"] == str(NOW)
    # retried and failed: as 4.0.0 does
    assert lua.retry("c1", c, run_at=NOW + 20, now=NOW + 10) == 0
    assert r.hget(lua.B + ":rec", "c").split("\t")[0].split(" ")[5] == "1"  # attempts (5.0)
    assert lua.fail("c1", d, now=NOW + 10) == 0
    failed = lua.record("d")
    assert (failed["state"], failed["attempts"], failed["leased_at"]) == ("failed", "1", str(NOW))
    # swept: the dead client's job goes back to waiting, stalled once
    later = NOW + 5_000
    checkout = lua.dequeue("c2", limit=10, now=later)
    assert sorted(checkout.ids) == ["c", "e", "f"]
    jobs = {job.id: job for job in checkout.jobs}
    assert jobs["e"].stall_count == 1
    # leased under 4.1.0 to 5.0.0, the lease held the record's numbers, and acks read them
    # there; 5.1.0's holds the token and its time again, and acks read the record
    held = r.hget(lua.B + ":lease:c2", "e")
    assert held == f"{jobs['e'].token} {later}"
    for job in checkout.jobs:
        assert lua.finish("c2", job, now=later + 1) == 0
    lines = {f["event"].split(" ")[1]: f["event"] for _, f in r.xrange(lua.B + ":events")}
    assert lines["e"] == f"finished e {later + 1} {later - 4} 42 {later} {NOW} 0 1 0 c2"
    assert r.hget(lua.B + ":ends", "c").split(" ")[4] == "2"
    assert lua.counts(now=later + 1)["active"] == 0


def test_a_4_0_0_library_loaded_back_over_4_1_leases_carries_them_on(r4: redis.Redis) -> None:
    """4.1.0 changed no argument nor reply, and 4.0.0 reads a lease of 4.1.0 as its own (the
    token first, leased_at last; the numbers from the record): a 4.0.0 process beside 4.1.0
    ones, or a server set back to 4.0.0, acks, reads and sweeps its jobs (hence a minor
    version: the processes of a server need not upgrade together)."""
    r = r4
    upgrade_4(r)
    lua = Lua(r, "down")
    lua.dispatch(*[(id, f'"{id}"', "") for id in "abcd"])
    a, b, c = lua.dequeue("c1", limit=3).jobs
    (d,) = lua.dequeue("dead", limit=1, expiry=1_000).jobs
    assert r.hget(lua.B + ":lease:c1", "a") == f"{a.token} {NOW} {NOW} 0 0 0 1 {NOW}"
    r.function_load((FIXTURES / "queasy-4.0.0.lua").read_text(), replace=True)
    assert r.fcall("queasy_library", 0) == "queasy_py 4.0.0"
    rec = lua.record("b")
    assert (rec["state"], rec["client"], rec["leased_at"], rec["attempts"]) == (
        "active", "c1", str(NOW), "1",
    )  # fmt: skip
    assert lua.finish("c1", a, now=NOW + 10) == 0
    assert lua.retry("c1", b, run_at=NOW, now=NOW + 10) == 0
    assert lua.fail("c1", c, now=NOW + 10) == 0
    lines = [f["event"] for _, f in r.xrange(lua.B + ":events")]
    assert lines[0] == f"finished a {NOW + 10} {NOW + 5} 42 {NOW} {NOW} 0 0 0 c1"
    assert [line.split(" ")[0] for line in lines] == ["finished", "retried", "failed"]
    assert r.hget(lua.B + ":ends", "a").split(" ")[4] == "1"
    checkout = lua.dequeue("c2", limit=10, now=NOW + 5_000)
    assert sorted(checkout.ids) == ["b", "d"]
    assert {job.id: job.stall_count for job in checkout.jobs}["d"] == 1


def test_jobs_of_4_1_carry_on_under_4_2_and_back(r41: redis.Redis) -> None:
    """4.2.0 changed no stored layout, argument nor reply (profile item 21: fewer commands
    per call): leases taken under 4.1.0 (tests/fixtures/queasy-4.1.0.lua, as released) are
    acked and swept under 4.2.0 with the same events, and 4.1.0 loaded back over 4.2.0's
    leases does the same (a minor version: the processes of a server need not upgrade
    together)."""
    r = r41
    lua = Lua(r, "up41")
    lua.dispatch(*[(id, f'"{id}"', "") for id in "abcdefgh"])
    a, b, c = lua.dequeue("c1", limit=3).jobs
    (d,) = lua.dequeue("dead", limit=1, expiry=1_000).jobs
    assert r.hget(lua.B + ":lease:c1", "a") == f"{a.token} {NOW} {NOW} 0 0 0 1 {NOW}"
    upgrade_4(r)
    e, f = lua.dequeue("c1", limit=2).jobs
    assert r.hget(lua.B + ":lease:c1", "e") == f"{e.token} {NOW} {NOW} 0 0 0 1 {NOW}"
    assert lua.finish("c1", a, now=NOW + 10) == 0
    assert lua.retry("c1", b, run_at=NOW, now=NOW + 10) == 0
    assert lua.fail("c1", c, now=NOW + 10) == 0
    r.function_load((FIXTURES / "queasy-4.1.0.lua").read_text(), replace=True)
    assert r.fcall("queasy_library", 0) == "queasy_py 4.1.0"
    assert lua.finish("c1", e, now=NOW + 10) == 0
    assert lua.finish("c1", f, now=NOW + 10) == 0
    lines = [x["event"] for _, x in r.xrange(lua.B + ":events")]
    assert lines[0] == f"finished a {NOW + 10} {NOW + 5} 42 {NOW} {NOW} 0 0 0 c1"
    assert lines[3] == f"finished e {NOW + 10} {NOW + 5} 42 {NOW} {NOW} 0 0 0 c1"
    assert [line.split(" ")[0] for line in lines] == [
        "finished", "retried", "failed", "finished", "finished",
    ]  # fmt: skip
    upgrade_4(r)  # and forward again: the dead client's job is swept, b retried
    checkout = lua.dequeue("c2", limit=10, now=NOW + 5_000)
    assert sorted(checkout.ids) == ["b", "d", "g", "h"]
    assert {job.id: job.stall_count for job in checkout.jobs}["d"] == 1
    for job in checkout.jobs:
        assert lua.finish("c2", job, now=NOW + 5_001) == 0
    assert lua.counts(now=NOW + 5_001)["active"] == 0


@pytest.fixture
def r421(own_server: EmbeddedServer) -> Iterator[redis.Redis]:
    yield from loaded(own_server, "4.2.1")


def test_4_2_1_calls_keep_their_replies_under_4_3_and_its_state_carries_on(
    r421: redis.Redis,
) -> None:
    """4.3.0 (a minor) adds only an optional trailing argument (queasy_purge's counted) and
    refusals of bad input (the id 'schedule' of a scheduled queue): a 4.2.1 client's calls
    get the replies they know, leases taken under 4.2.1 are acked under 4.3.0, and 4.2.1
    loaded back over 4.3.0 carries its leases on (tests/fixtures/queasy-4.2.1.lua, as
    released)."""
    r = r421
    lua = Lua(r, "up421")
    lua.dispatch(*[(id, f'"{id}"', "") for id in "ab"])
    a, b = lua.dequeue("c1", limit=2).jobs
    upgrade_4(r)
    assert lua.finish("c1", a, now=NOW + 1) == 0
    assert lua.fail("c1", lua.take("a", now=NOW + 2), now=NOW + 2) == 0  # a: finished, failed
    assert lua.purge("finished") == [1, 0]  # a 4.2.1 call: {removed, left}, as before
    assert lua.call("queasy_purge", [lua.B], NOW + 3, "failed", 10, "1") == [1, 0, 1]
    lua.dispatch(*[(id, f'"{id}"', "") for id in "cd"], now=NOW + 3)
    c, d = lua.dequeue("c1", limit=2, now=NOW + 3).jobs
    r.function_load((FIXTURES / "queasy-4.2.1.lua").read_text(), replace=True)
    assert r.fcall("queasy_library", 0) == "queasy_py 4.2.1"
    assert [lua.finish("c1", job, now=NOW + 4) for job in (b, c, d)] == [0, 0, 0]
    assert lua.counts(now=NOW + 4)["active"] == 0


def test_purge_of_a_4_3_client_works_when_4_2_1_is_loaded_back(
    own_server: EmbeddedServer, r421: redis.Redis
) -> None:
    """4.2.1 loaded back by hand (a downgrade) under a running 4.3.0 process: 4.2.1's
    queasy_purge ignores the `counted` argument and replies {removed, left}; purge() then
    counts what it removed, as 4.2.1 did, instead of failing to unpack the reply."""
    from queasy_py import Client

    with Client(own_server.url, workers=0, prefix="down") as client:
        q = client.queue("q")
        client.ready()  # 4.3.0 loaded over 4.2.1
        q.dispatch_many([{"data": {}} for _ in range(3)])
        r421.function_load((FIXTURES / "queasy-4.2.1.lua").read_text(), replace=True)
        assert r421.fcall("queasy_library", 0) == "queasy_py 4.2.1"
        assert q.purge("waiting") == 3
        assert q.counts()["waiting"] == 0


@pytest.fixture
def r431(own_server: EmbeddedServer) -> Iterator[redis.Redis]:
    yield from loaded(own_server, "4.3.1")


def test_a_schedule_of_4_3_carries_on_under_4_4_which_can_drop_it(r431: redis.Redis) -> None:
    """4.4.0 (a minor) only adds queasy_unschedule: a schedule and its occurrence leased under
    4.3.1 (tests/fixtures/queasy-4.3.1.lua, main's library before 4.4.0) are acked and checked
    under 4.4.0, whose unschedule drops it once its occurrence ended; 4.3.1 loaded back over
    4.4.0 reads a schedule 4.4.0 wrote."""
    r = r431
    lua = Lua(r, "up431")
    schedule(lua, None, NOW + 1_000)
    (job,) = lua.dequeue("c1", now=NOW + 1_000).jobs
    upgrade_4(r)
    assert lua.call("queasy_unschedule", [lua.B], NOW + 1_001) == [2, "active"]
    assert lua.finish("c1", job, now=NOW + 1_002) == 0
    assert schedule(lua, NOW + 1_000, NOW + 2_000, now=NOW + 1_003).code == 2  # created
    assert lua.cancel("schedule", now=NOW + 1_004) == 1
    assert lua.call("queasy_unschedule", [lua.B], NOW + 1_005) == [1, ""]
    assert schedule_info(lua, now=NOW + 1_005) is None
    assert schedule(lua, None, NOW + 3_000, now=NOW + 1_006).code == 2  # a supervisor that keeps it
    r.function_load((FIXTURES / "queasy-4.3.1.lua").read_text(), replace=True)
    info = schedule_info(lua, now=NOW + 1_007)
    assert info is not None and info["fire_at"] == str(NOW + 3_000)
