"""The `queasy` command's conventions (issue 10), run from the outside as a user would: the
console script in a temporary app directory, with only queasy_py itself on PYTHONPATH (as if
installed), never the app's directory.

- `queasy run` imports the app from the working directory, which comes after the installed
  packages (issue 18 point 7), in the supervisor and in its workers;
- `--log-level` before or after the subcommand, applied to the workers, whose lines keep the
  logger name and the command's format;
- every error of the command line or the config exits CONFIG (2) with one line, no traceback;
- Ctrl-C while waiting for Redis exits INTERRUPTED (130) cleanly, one log line per try;
- the [tool.queasy] table of pyproject.toml, and errors naming keys as the file read writes them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from runtime_helpers import wait_for

import queasy_py
from queasy_py import Client
from queasy_py.cli import exitcodes
from queasy_py.store.embedded import free_port

QUEASY = str(Path(sys.executable).with_name("queasy"))
#: where queasy_py is imported from: the only PYTHONPATH entry the command gets
PACKAGE_ROOT = str(Path(queasy_py.__file__).resolve().parent.parent)

APP_JOBS = """
import json, logging, os, sys

import pluggy  # installed; the app directory's pluggy.py must not be imported instead

log = logging.getLogger("myapp.jobs")


def record(kind):
    out = {"pid": os.getpid(), "path": sys.path, "pluggy": pluggy.__file__}
    with open(os.path.join(os.environ["APP_RECORDS"], f"{kind}-{os.getpid()}.json"), "w") as f:
        json.dump(out, f)


record("import")  # in the supervisor (listen checks the handler) and in each worker


def handle(data, job):
    log.info("info line of job %s", job.id)
    log.debug("debug line of job %s", job.id)
    record("job")
"""


def command_env(**extra: str) -> dict[str, str]:
    """The environment of the command: no PYTHONPATH but queasy_py's, no Redis URL."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "QUEASY_REDIS_URL")}
    return {**env, "PYTHONPATH": PACKAGE_ROOT, **extra}


@dataclass
class App:
    """A user's app directory: myapp/jobs.py, a config, and where its handler records go."""

    dir: Path
    records: Path
    url: str
    prefix: str

    def config(self, name: str = "queasy.toml") -> str:
        settings = "workers = 1\nheartbeat_interval = 0.5\nshutdown_timeout = 5.0\n"
        (self.dir / name).write_text(
            f'redis = "{self.url}"\nprefix = "{self.prefix}"\n{settings}'
            '[queues.q]\nhandler = "myapp.jobs"\n'
        )
        return name

    def start(self, *args: str) -> tuple[subprocess.Popen, Path]:
        """`queasy ARGS` in the app directory, in a session of its own (a terminal's group)."""
        log_path = self.dir / f"queasy-{len(list(self.dir.glob('queasy-*.log')))}.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                [QUEASY, *args],
                cwd=self.dir,
                env=command_env(APP_RECORDS=str(self.records)),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return proc, log_path

    def run_one_job(self, *args: str) -> tuple[str, dict, dict, int]:
        """`queasy ARGS`, one job through it, SIGTERM: (its output, the worker's job record,
        the supervisor's import record, its pid)."""
        proc, log_path = self.start(*args)
        try:
            with Client(self.url, workers=0, prefix=self.prefix) as producer:
                producer.queue("q").dispatch({}, id="j1")
            wait_for(lambda: list(self.records.glob("job-*.json")), 30, "the job's record")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == exitcodes.OK
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        (job_file,) = self.records.glob("job-*.json")
        job = json.loads(job_file.read_text())
        supervisor = json.loads((self.records / f"import-{proc.pid}.json").read_text())
        return log_path.read_text(), job, supervisor, proc.pid


@pytest.fixture
def app(tmp_path: Path, redis_url: str, prefix: str) -> App:
    root = tmp_path / "app"
    (root / "myapp").mkdir(parents=True)
    (root / "myapp" / "__init__.py").write_text("")
    (root / "myapp" / "jobs.py").write_text(APP_JOBS)
    (root / "pluggy.py").write_text('raise ImportError("the app directory shadowed pluggy")\n')
    records = tmp_path / "records"
    records.mkdir()
    return App(root, records, redis_url, prefix)


def run_queasy(cwd: Path, *args: str, timeout: float = 30.0) -> tuple[int, str]:
    done = subprocess.run(
        [QUEASY, *args],
        cwd=cwd,
        env=command_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
        text=True,
    )
    return done.returncode, done.stdout


# ---------------------------------------------------------------- the app's directory


def test_queasy_run_imports_the_app_from_its_directory_after_the_installed_packages(
    app: App,
) -> None:
    _, job, supervisor, sup_pid = app.run_one_job("run", app.config())
    assert job["pid"] != sup_pid  # ran in a worker
    site = os.path.dirname(os.path.dirname(pytest.__file__))  # this interpreter's packages
    here = str(app.dir.resolve())
    for seen in (supervisor, job):
        path = seen["path"]
        assert here in path and "" not in path
        assert path.index(here) > path.index(site), path
        assert seen["pluggy"].startswith(site)  # the installed one, not the app's file


# ---------------------------------------------------------------- --log-level


@pytest.mark.parametrize("where", ["before", "after", "default"])
def test_log_level_before_or_after_the_subcommand_reaches_the_workers(app: App, where: str) -> None:
    config = app.config()
    args = {
        "before": ["--log-level", "DEBUG", "run", config],
        "after": ["run", config, "--log-level", "debug"],
        "default": ["run", config],
    }[where]
    out, job, _, sup_pid = app.run_one_job(*args)
    worker = job["pid"]
    # the worker's lines: the handler's logger name and pid, in the command's format
    line = rf"^\d{{4}}-\d\d-\d\d [\d:,]+ myapp\.jobs\[{worker}\] %s %s line of job j1$"
    assert re.search(line % ("INFO", "info"), out, re.MULTILINE), out
    debug_shown = re.search(line % ("DEBUG", "debug"), out, re.MULTILINE) is not None
    assert debug_shown == (where != "default"), out
    # the supervisor's own debug lines follow the same level
    supervisor_debug = f"queasy_py[{sup_pid}] DEBUG started worker pid {worker}"
    assert (supervisor_debug in out) == (where != "default"), out
    assert "Traceback" not in out


def test_every_subcommand_takes_the_log_level_after_it() -> None:
    """README: --log-level goes before or after the subcommand. `queasy history archive
    ... --log-level DEBUG` was 'unrecognized arguments' (exit 2)."""
    from queasy_py.cli.main import build_parser

    parser = build_parser()
    commands = [
        ["run"], ["server"], ["dispatch", "q", "1"], ["cancel", "q", "i"], ["unschedule", "q"],
        ["status"],
        ["jobs", "q"], ["inspect", "q", "i"], ["requeue", "q"], ["purge", "q"], ["events", "q"],
        ["history", "archive", "--path", "d"], ["history", "report", "--path", "d"],
        ["dashboard"],
    ]  # fmt: skip
    for command in commands:
        assert parser.parse_args([*command, "--log-level", "debug"]).log_level == "DEBUG", command
        assert parser.parse_args(["--log-level", "error", *command]).log_level == "ERROR", command


# ---------------------------------------------------------------- errors: exit 2, one line

BAD_VALUE = '[queues.q]\nhandler = "myapp.jobs"\nsize = "big"\n'
#: braces in the prefix: refused naming the key, before any server is started or joined
BAD_PREFIX = 'prefix = "a{b}"\n[queues.q]\nhandler = "myapp.jobs"\n'


@pytest.mark.parametrize(
    ("args", "files", "message"),
    [
        (["--log-level", "LOUD", "run", "c.toml"], {}, "unknown level 'LOUD'"),
        (["run", "c.toml", "--log-level", "LOUD"], {}, "unknown level 'LOUD'"),
        (["run", "c.toml", "--redis", "http://127.0.0.1:6379/0"], {}, "must start with redis://"),
        (["run", "c.toml"], {"c.toml": 'redis = "localhost:6379"\n'}, "redis: invalid Redis URL"),
        (["run", "c.toml", "--bogus"], {}, "unrecognized arguments: --bogus"),
        (["--bogus", "run"], {}, "unrecognized arguments: --bogus"),
        ([], {}, "the following arguments are required"),
        (["run", "c.toml", "--workers", "two"], {}, "--workers: invalid int value: 'two'"),
        (["run", "missing.toml"], {}, "cannot read config missing.toml"),
        (["run"], {}, "no config file given and no ./pyproject.toml"),
        (["run", "c.toml"], {"c.toml": BAD_VALUE}, "c.toml: queues.q: size must be an int"),
        (["run", "c.toml"], {"c.toml": b"\xff\xfe[queues]"}, "c.toml is not UTF-8 text"),
        (["run", "c.toml"], {"c.toml": "[queues.q\n"}, "malformed TOML in c.toml"),
        (["dispatch", "q", "{not json"], {}, "job data is not JSON"),
        (["dispatch", "q", "{}", "--delay", "soon"], {}, "--delay: invalid float value"),
        (["run", "c.toml"], {"c.toml": BAD_PREFIX}, "c.toml: prefix: invalid key prefix 'a{b}'"),
        (
            ["dispatch", "q", "{}", "--config", "c.toml"],
            {"c.toml": BAD_PREFIX},
            "c.toml: prefix: invalid key prefix 'a{b}'",
        ),
    ],
    ids=[
        "bad_level",
        "bad_level_after",
        "bad_scheme",
        "bad_scheme_in_config",
        "bad_flag",
        "bad_flag_first",
        "no_command",
        "bad_flag_value",
        "missing_config",
        "no_config_no_pyproject",
        "bad_config_value",
        "config_not_utf8",
        "malformed_toml",
        "dispatch_bad_json",
        "dispatch_bad_delay",
        "bad_prefix_in_config",
        "dispatch_bad_prefix_in_config",
    ],
)
def test_each_command_line_or_config_error_exits_2_with_one_line(
    tmp_path: Path, args: list[str], files: dict[str, str | bytes], message: str
) -> None:
    (tmp_path / "c.toml").write_text('[queues.q]\nhandler = "myapp.jobs"\n')
    for name, content in files.items():
        if isinstance(content, bytes):
            (tmp_path / name).write_bytes(content)
        else:
            (tmp_path / name).write_text(content)
    code, out = run_queasy(tmp_path, *args)
    assert code == exitcodes.CONFIG == 2, out
    assert "Traceback" not in out
    assert len(out.strip().splitlines()) == 1, out
    assert message in out


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["status"], "?ssl_cert_reqs=none"),  # a TLS option on a redis:// URL
        (["dispatch", "q", "{}"], "?sockettimeout=5"),  # a typo
        (["run", "c.toml"], "?protocol=9"),
        (["dashboard", "--port", "0"], "?client_nmae=x"),
    ],
    ids=["tls_option_without_tls", "typo", "bad_protocol", "dashboard"],
)
def test_a_url_option_redis_py_refuses_exits_2_with_one_line(
    tmp_path: Path, args: list[str], option: str
) -> None:
    """redis-py refuses an unknown URL option only when it makes the first connection (a
    TypeError) or retries a bad protocol as an outage: the command showed a traceback and
    exited 1, or tried three times and exited CONNECT. It is the URL that is wrong."""
    (tmp_path / "c.toml").write_text('[queues.q]\nhandler = "myapp.jobs"\n')
    url = f"redis://:pw-of-the-test@127.0.0.1:{free_port()}/0{option}"
    code, out = run_queasy(tmp_path, *args, "--redis", url)
    assert code == exitcodes.CONFIG, out
    assert "Traceback" not in out
    assert len(out.strip().splitlines()) == 1, out
    assert "invalid Redis URL" in out and option[1:].split("=")[0] in out
    assert "pw-of-the-test" not in out


# ---------------------------------------------------------------- waiting for Redis


def test_ctrl_c_while_waiting_for_redis_exits_130_after_one_line_per_try(app: App) -> None:
    port = free_port()  # nothing listens there
    proc, log_path = app.start("run", app.config(), "--redis", f"redis://127.0.0.1:{port}/0")
    try:
        wait_for(lambda: "(try 2)" in log_path.read_text(), 30, "the second try's line")
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: its process group
        assert proc.wait(timeout=15) == exitcodes.INTERRUPTED == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = log_path.read_text().strip().splitlines()
    assert "Traceback" not in log_path.read_text()
    *tries, last = lines
    assert last.endswith("WARNING interrupted: queasy run stopped"), lines
    retry = re.compile(
        rf"WARNING cannot connect to Redis at redis://127\.0\.0\.1:{port}/0: .*Connection "
        r"refused.*; retrying in \d+s \(try (\d+)\)$"
    )
    numbers = []
    for line in tries:  # every other line is one try's, numbered 1, 2, ...
        match = retry.search(line)
        assert match, line
        numbers.append(int(match.group(1)))
    assert numbers == list(range(1, len(tries) + 1)) and len(tries) >= 2, lines


# ---------------------------------------------------------------- pyproject.toml


def test_pyproject_tool_queasy_config_runs_the_app(app: App) -> None:
    (app.dir / "pyproject.toml").write_text(
        '[project]\nname = "myapp"\nversion = "1.0"\n\n'
        f'[tool.queasy]\nredis = "{app.url}"\nprefix = "{app.prefix}"\nworkers = 1\n'
        "heartbeat_interval = 0.5\nshutdown_timeout = 5.0\n\n"
        '[tool.queasy.queues.q]\nhandler = "myapp.jobs"\n'
    )
    out, job, _, sup_pid = app.run_one_job("run")  # no file given: ./pyproject.toml
    assert job["pid"] != sup_pid
    assert "queasy run: pyproject.toml on " in out


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "pyproject.toml",
            '[project]\nname = "x"\n[tool.queasy]\nworkers = 1\n',
            "pyproject.toml: tool.queasy.queues: at least one [tool.queasy.queues.NAME] table",
        ),
        (
            "pyproject.toml",
            '[project]\nname = "x"\n[queues.q]\nhandler = "myapp.jobs"\n',  # the other form
            "pyproject.toml has no [tool.queasy] table: add [tool.queasy.queues.NAME] tables",
        ),
        (
            "pyproject.toml",
            '[tool.queasy.queues.q]\nhandler = "myapp.jobs"\nsise = 1\n',
            "pyproject.toml: tool.queasy.queues.q.sise: unknown key",
        ),
        (
            "queasy.toml",
            "workers = 1\n",
            "queasy.toml: queues: at least one [queues.NAME] table",
        ),
        (
            "queasy.toml",
            '[tool.queasy.queues.q]\nhandler = "myapp.jobs"\n',  # the pyproject form
            "queasy.toml: tool: unknown key",
        ),
    ],
    ids=[
        "pyproject_no_queues",
        "pyproject_wrong_form",
        "pyproject_key",
        "file_no_queues",
        "file_wrong_form",
    ],
)
def test_config_errors_name_keys_as_the_file_read_writes_them(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    (tmp_path / name).write_text(text)
    args = ["run"] if name == "pyproject.toml" else ["run", name]
    code, out = run_queasy(tmp_path, *args)
    assert code == exitcodes.CONFIG, out
    assert message in out
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in out


@pytest.mark.parametrize("command", ["run", "status", "dashboard"])
@pytest.mark.parametrize("text", ['tool = "x"\n', "tool = [1]\n"], ids=["str", "array"])
def test_a_pyproject_whose_tool_is_not_a_table_exits_2_with_one_line(
    tmp_path: Path, command: str, text: str
) -> None:
    """`tool` that is not a table in ./pyproject.toml made every command that reads it (run,
    and the others for `redis` and `prefix`) die with AttributeError: 'str' object has no
    attribute 'get', a traceback and exit 1."""
    (tmp_path / "pyproject.toml").write_text(text)
    code, out = run_queasy(tmp_path, command, "--redis", f"redis://127.0.0.1:{free_port()}/0")
    assert code == exitcodes.CONFIG, out
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in out, out
    assert "pyproject.toml: tool must be a table" in out
