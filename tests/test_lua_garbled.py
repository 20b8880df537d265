"""Library 4.0.0's one-line values (a lease "<token> <leased_at>" in B:lease:<client>, an end
"<state> ... <client> <host>" in B:ends) as a producer with raw Redis access may garble them,
and as an unusual but valid argument (a host with spaces) writes them.

README "Threat model": a number field garbled around the library reads as 0; it must not fail
the call that acks it (a Lua error after the first write leaves the call half-done: the job's
record gone, its lease kept) nor the other jobs of the same call.
"""

from __future__ import annotations

import pytest
import records
import redis
from lua_calls import EXPIRY, HOST, KEEP, MAXLEN, NOW, Leased, Lua

from queasy_py.cli.show import event_line
from queasy_py.records import job_info
from queasy_py.store import events
from queasy_py.store.library import ensure_loaded

#: what may follow "<token>" in a garbled lease: a space, then whitespace other than a space
GARBLED = [" 12\t3", " \n", " 1\r", " 1\x0b2"]


@pytest.fixture
def lua(r: redis.Redis, redis_url: str, prefix: str) -> Lua:
    with redis.Redis.from_url(redis_url) as conn:
        ensure_loaded(conn)
    return Lua(r, prefix)


def retried(lua: Lua, *ids: str) -> list[Leased]:
    """Jobs `ids` leased to c1, each with an earlier retry (so its end is kept whole, with
    its leased_at; library 4.1.0: its lease holds its retry_count, which a finish reads)."""
    for id in ids:
        lua.add(id)
    for job in lua.dequeue("c1", limit=len(ids)).jobs:
        assert lua.retry("c1", job, run_at=NOW) == 0
    jobs = lua.dequeue("c1", limit=len(ids)).jobs
    assert sorted(job.id for job in jobs) == sorted(ids)
    assert all(job.retry_count == 1 for job in jobs)
    return jobs


def two_leased(lua: Lua, r: redis.Redis, suffix: str) -> list[tuple[str, str]]:
    """Jobs a and b leased to c1, each with an earlier retry; a's lease value garbled after
    its token."""
    jobs = retried(lua, "a", "b")
    tokens = {job.id: job.token for job in jobs}
    r.hset(f"{lua.B}:lease:c1", "a", tokens["a"] + suffix)
    return [("a", tokens["a"]), ("b", tokens["b"])]


@pytest.mark.parametrize("suffix", GARBLED, ids=repr)
@pytest.mark.parametrize("ack", ["finish", "fail"])
def test_a_garbled_leased_at_reads_as_0_and_every_job_of_the_call_ends(
    lua: Lua, r: redis.Redis, ack: str, suffix: str
) -> None:
    leases = two_leased(lua, r, suffix)
    head = [NOW + 5, "c1", MAXLEN, *KEEP, HOST, 0]
    args: list = []
    for job_id, token in leases:
        if ack == "finish":
            args += [job_id, token, "42", NOW + 1, ""]
        else:
            args += [job_id, token, "", "", "42", NOW + 1, "KeyError", "permanent", "m", "t"]
    codes = lua.call(f"queasy_{ack}", [lua.B], *head, *args)
    assert codes == [0, 0]
    state = "finished" if ack == "finish" else "failed"
    a, b = lua.record("a"), lua.record("b")
    assert a is not None and a["state"] == state and a["leased_at"] == "0", a
    assert b is not None and b["state"] == state and b["leased_at"] == str(NOW), b
    assert r.hlen(f"{lua.B}:lease:c1") == 0, "no lease left behind"
    assert lua.counts()["active"] == 0


@pytest.mark.parametrize("host", ["my host", "build box 7", "a\tb", "trailing "], ids=repr)
def test_an_end_keeps_a_host_with_spaces_whole(lua: Lua, r: redis.Redis, host: str) -> None:
    job = lua.take("a")
    head = [NOW + 5, "c1", MAXLEN, *KEEP, host, 0]
    assert lua.call("queasy_finish", [lua.B], *head, job.id, job.token, "42", NOW, "") == [0]
    assert not r.exists(f"{lua.B}:ended:a"), "the end alone is kept (B:ends)"
    rec = lua.record("a")
    assert rec is not None and rec["host"] == host and rec["client"] == "c1", rec
    row = lua.call("queasy_get_job", [lua.B], NOW, "a")
    assert job_info("q", row).host == host


@pytest.mark.parametrize(
    "line",
    [
        "finished  1 - - 1 2 3 0 0 0 c1 h",  # two spaces
        "finished\t1 - - 1 2 3 0 0 0 c1 h",  # a tab
        "finished 1 - - 1 2 3 0 0 0 c1 h\tx",
    ],
    ids=repr,
)
def test_a_garbled_end_does_not_shift_the_fields_after_it(
    lua: Lua, r: redis.Redis, line: str
) -> None:
    (job,) = retried(lua, "a")  # kept whole: the record has its data
    assert lua.finish("c1", job) == 0
    r.hset(f"{lua.B}:ends", "a", line)
    row = lua.call("queasy_get_job", [lua.B], NOW, "a")
    flat = row[1]
    assert len(flat) % 2 == 0, flat
    rec = dict(zip(flat[0::2], flat[1::2], strict=True))
    assert rec["state"] == "finished" and rec["client"] == "c1", rec
    assert rec["host"].startswith("h"), rec
    assert rec["data"] == '"x"', rec


@pytest.mark.parametrize("spaced", ["a b", "x 5 6 -", " lead", "trail "], ids=repr)
def test_an_event_of_an_id_with_spaces_written_around_the_library_reads_whole(
    lua: Lua, r: redis.Redis, spaced: str
) -> None:
    """The id rules forbid spaces, but a record written with raw ZADD/HSET may hold any id:
    its event line then has more words than the schema; the id is what lies between the
    outcome and the line's last 9 words, so no field after it shifts (the pid, the times,
    the client of the job's event were the words after the id's first)."""
    lua.add("ok")
    r.zadd(f"{lua.B}:waiting", {spaced: NOW})
    records.put_record(r, lua.B, spaced, {"id": spaced, "data": '"x"', "run_at": str(NOW)})
    jobs = {job.id: job for job in lua.dequeue("c1", limit=5).jobs}
    assert set(jobs) == {"ok", spaced}
    for job in jobs.values():
        assert lua.finish("c1", job, now=NOW + 7) == 0
    read = {e["id"]: e for e in events.page(r, f"{lua.B}:events")}
    assert set(read) == {"ok", spaced}, read
    for event in read.values():
        assert event["outcome"] == "finished" and event["client"] == "c1", event
        assert (event["ended_at"], event["pid"], event["run_at"]) == (NOW + 7, 42, NOW), event
        assert event["started_at"] == NOW + 2 and event["retry_count"] == 0, event


#: a number longer than the library writes (15 digits), at each place of a 4.1.0 lease
LONG = "9" * 350


@pytest.mark.parametrize("place", range(6), ids=lambda p: f"number {p + 1}")
def test_a_lease_number_longer_than_the_library_writes_is_read_from_the_record(
    lua: Lua, r: redis.Redis, place: int
) -> None:
    """Library 4.1.0: finish takes a job's numbers from its lease. One garbled to hundreds of
    digits went into the finished event as it was, and a reader's float of it overflowed
    (`queasy events` failed on the stream: cli.show.event_line). Such a lease's numbers are
    read from the record, as for a 4.0.0 lease (passed(): as written, at most 15 digits)."""
    leases = {job.id: job.token for job in retried(lua, "a", "b")}
    key = f"{lua.B}:lease:c1"
    # a's lease as 4.1.0 to 5.0.0 wrote it (5.1.0 writes "<token> <leased_at>", which every
    # later reader takes): token, run_at, enqueued_at, 3 counts, attempts (+ its lease), at
    token, at = r.hget(key, "a").split(" ")
    nums = r.hget(f"{lua.B}:rec", "a").split("\t")[0].split(" ")
    words = [token, *nums[:5], str(int(nums[5]) + 1), at]
    words[1 + place] = LONG
    r.hset(key, "a", " ".join(words))
    head = [NOW + 5, "c1", MAXLEN, *KEEP, HOST, 0]
    args = [x for id in ("a", "b") for x in (id, leases[id], "42", NOW + 1, "")]
    assert lua.call("queasy_finish", [lua.B], *head, *args) == [0, 0]
    read = {e["id"]: e for e in events.page(r, f"{lua.B}:events") if e["outcome"] == "finished"}
    assert set(read) == {"a", "b"}, read
    for event in read.values():
        assert (event["run_at"], event["enqueued_at"]) == (NOW, NOW), event
        assert (event["retry_count"], event["stall_count"], event["timeout_count"]) == (1, 0, 0)
        assert event_line(event)  # a reader of the stream does not fail on it
    a = lua.record("a")
    assert a is not None and a["state"] == "finished" and a["attempts"] == "2", a
    assert a["retry_count"] == "1" and a["error_name"] == "ValueError", "kept whole"
    assert r.hlen(key) == 0 and lua.counts()["active"] == 0


@pytest.mark.parametrize("enqueued", ["1 2", "1 2 3 4 5 6 7", "12 ", " 12", "1\t2"], ids=repr)
def test_an_enqueued_at_garbled_with_spaces_shifts_no_number_of_the_lease(
    lua: Lua, r: redis.Redis, enqueued: str
) -> None:
    """Library 4.1.0 copies a record's enqueued_at into its lease ("<token> <run_at>
    <enqueued_at> <retry_count> ..."), and finish reads the numbers after the token by their
    place. An enqueued_at of digits and spaces (written around the library) moved each
    number after it one place on: the job's end and event had its retry_count for its
    enqueued_at's second word, its timeout_count for its attempts. Such a record gets a lease
    of 4.0.0 ("<token> <leased_at>"), and its ack reads the record."""
    lua.add("a")
    records.garble(r, lua.B, "a", "enqueued_at", enqueued)
    (job,) = lua.dequeue("c1", limit=1).jobs
    assert lua.retry("c1", job, run_at=NOW) == 0  # retry_count 1: its end kept whole
    (job,) = lua.dequeue("c1", limit=1).jobs
    assert lua.finish("c1", job, now=NOW + 7) == 0
    (event,) = [e for e in events.page(r, f"{lua.B}:events") if e["ended_at"] == NOW + 7]
    assert (event["run_at"], event["enqueued_at"]) == (NOW, None), event
    assert (event["retry_count"], event["stall_count"], event["timeout_count"]) == (1, 0, 0)
    a = lua.record("a")
    assert a is not None and a["state"] == "finished" and a["attempts"] == "2", a
    assert a["retry_count"] == "1" and a["error_name"] == "ValueError", "kept whole"


@pytest.mark.parametrize("suffix", ["\t" + str(NOW), "\t1 2 3", "\n", "\t"], ids=repr)
def test_a_sweep_requeues_a_job_whose_lease_has_whitespace_after_its_token(
    lua: Lua, r: redis.Redis, suffix: str
) -> None:
    """The sweep read a lease's token up to any whitespace, and holds() up to a space: a
    lease garbled as "<token>\\t..." was no lease of its token, and the sweep deleted it with
    the client's other leases, leaving its job active for good. The job goes back to
    waiting as any swept job does."""
    job = lua.take("a", client="c1")
    r.hset(f"{lua.B}:lease:c1", "a", job.token + suffix)
    again = lua.dequeue("c2", now=NOW + EXPIRY + 1).jobs
    assert [(j.id, j.stall_count) for j in again] == [("a", 1)]
    assert not r.exists(f"{lua.B}:lease:c1")
