"""The web dashboard (issue 15), run as a user runs it: `queasy dashboard` as a subprocess on
the test server, read in a real headless browser (Debian's chromium through chromium-driver
and Selenium, one browser for the module) and over plain HTTP for the security rules.

- the main page shows the store: counts equal to counts(), the live supervisor and the job it
  runs, recent failures with their tracebacks, the hour's chart from the outcome events, the
  schedules; a job's page; the requeue button (with its confirmation) requeues in the store;
  no page shows the server's password; the main page's screenshot is taken (into the test's
  temporary folder; QUEASY_SCREENSHOT=1 writes docs/dashboard.png, the README's picture);
- read-only mode shows no action and refuses a forged POST;
- a token is required of every request when given; the host, CSRF and origin rules;
- where it may listen: loopback only without a token (one-line error, exit CONFIG).
"""

from __future__ import annotations

import base64
import http.client
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import redis
from lua_calls import Lua
from runtime_helpers import ACT, Runtime, queue_spec, wait_for

import queasy_py
from queasy_py import Client
from queasy_py.cli import exitcodes
from queasy_py.errors import ConfigError
from queasy_py.history import History
from queasy_py.store.embedded import EmbeddedServer, free_port
from queasy_py.web import charts, security, server

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_ROOT = str(Path(queasy_py.__file__).resolve().parent.parent)
SCREENSHOT = ROOT / "docs" / "dashboard.png"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TOKEN = "s3cret-token-of-the-tests"
#: a server that keeps its data (and the function library) across a restart
AOF = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.fixture
def rt(redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(redis_url, prefix, r, tmp_path) as runtime:
        yield runtime


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless chromium for the module (Debian's, driven by its chromium-driver)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER), (
        "the dashboard tests need Debian's chromium and chromium-driver (.ci/run installs them)"
    )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1360,1200", "--hide-scrollbars"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def loaded(browser: Any, element_id: str, timeout: float = 15.0) -> Any:
    """The element `element_id` of the page a click leads to: a click returns before the next
    page has loaded when the machine is busy, so wait (bounded) for the element to appear."""
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    located = expected_conditions.presence_of_element_located(("id", element_id))
    return WebDriverWait(browser, timeout).until(located, f"no #{element_id} after {timeout}s")


# --- the dashboard as a subprocess --------------------------------------------------------------


@dataclass
class Dash:
    proc: subprocess.Popen
    url: str
    log_path: Path

    @property
    def port(self) -> int:
        return int(urlparse(self.url).port or 0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request(
        self, method: str, path: str, body: str | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], str]:
        """One HTTP request (no redirect followed): status, headers (lower-case), body."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            reply = conn.getresponse()
            got = {k.lower(): v for k, v in reply.getheaders()}
            cookies = reply.headers.get_all("set-cookie") or []
            got["set-cookie"] = "\n".join(cookies)
            return reply.status, got, reply.read().decode()
        finally:
            conn.close()


def queasy(*args: str, **extra_env: str) -> list[str]:
    return [sys.executable, "-m", "queasy_py.cli", *args]


def command_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEASY_")}
    return {**env, "PYTHONPATH": PACKAGE_ROOT, **extra}


@contextmanager
def dashboard(url: str, prefix: str, tmp_path: Path, *flags: str, **env: str) -> Iterator[Dash]:
    """`queasy dashboard --port 0 ...` running; its URL read from its log line."""
    log_path = tmp_path / f"dashboard-{len(list(tmp_path.glob('dashboard-*')))}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            queasy("dashboard", "--redis", url, "--prefix", prefix, "--port", "0", *flags),
            env=command_env(**env),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:

        def listening() -> Any:
            assert proc.poll() is None, f"the dashboard exited: {log_path.read_text()}"
            return re.search(r"queasy dashboard on (http://\S+/)", log_path.read_text())

        found = wait_for(
            listening,
            timeout=30,
            what="the dashboard's listening line",
        )
        yield Dash(proc, found[1], log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        print(f"----- dashboard log -----\n{log_path.read_text(errors='replace')}")


def cells(browser: Any, queue: str) -> dict[str, int]:
    """The counts a page shows for `queue` (cells with data-q/data-k)."""
    found = browser.find_elements("css selector", f'[data-q="{queue}"][data-k]')
    return {c.get_attribute("data-k"): int(c.text) for c in found}


def password_of(url: str) -> str:
    password = urlparse(url).password
    assert password, "the test server has a password (EmbeddedServer)"
    return password


# --- the browser: the main page, a job, requeue -------------------------------------------------


def test_the_main_page_shows_the_store_and_requeue_works(
    rt: Runtime, redis_url: str, prefix: str, tmp_path: Path, browser: Any
) -> None:
    sup = rt.start(
        {
            "work": queue_spec(ACT),
            "hourly": queue_spec(ACT, schedule_every=3600.0),
        },
        workers=1,
    )
    work, later = rt.queue("work"), rt.queue("later")
    for i in range(4):
        work.dispatch({"tag": "ok", "sleep": 0.05}, id=f"ok-{i}")
    for i in range(2):
        work.dispatch({"raise": "permanent", "message": f"card declined {i}"}, id=f"bad-{i}")
    rt.wait_events("work", 6)
    work.dispatch({"sleep": 60}, id="busy")  # runs until the supervisor is killed
    for i in range(3):
        later.dispatch({"n": i}, id=f"later-{i}", delay=3600)
    client = Client(redis_url, workers=0, prefix=prefix)
    supervisor = wait_for(
        lambda: [s for s in client.supervisors() if any(j["id"] == "busy" for j in s["jobs"])],
        what="the supervisor publishing the job it runs",
    )[0]
    wait_for(lambda: client.schedules().get("hourly"), what="the hourly schedule")

    with dashboard(redis_url, prefix, tmp_path) as dash:
        browser.get(dash.url)
        assert browser.title.startswith("dashboard")
        for name in ("work", "later", "hourly"):
            assert cells(browser, name) == rt.queue(name).counts(), name
        assert cells(browser, "work")["active"] == 1
        assert cells(browser, "work")["failed"] == 2
        assert cells(browser, "later")["delayed"] == 3
        sups = browser.find_element("id", "supervisors").text
        assert str(supervisor["pid"]) in sups and "work / busy" in sups
        failures = browser.find_element("id", "failures")
        assert "card declined 1" in failures.text and "bad-0" in failures.text
        traces = failures.find_elements("tag name", "pre")
        assert traces and "Traceback" in traces[0].get_attribute("textContent")
        throughput = browser.find_element("id", "throughput")
        assert throughput.get_attribute("data-finished") == "4"
        assert throughput.get_attribute("data-failed") == "2"
        assert browser.find_element("id", "hour-finished").text == "4"
        assert len(browser.find_elements("css selector", "#throughput rect.bar")) >= 2
        assert len(browser.find_elements("css selector", "#latency circle.dot")) >= 4
        assert "every 3600s" in browser.find_element("id", "schedules").text
        shot = SCREENSHOT if os.environ.get("QUEASY_SCREENSHOT") == "1" else tmp_path / "dash.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        password = password_of(redis_url)
        assert "***" in browser.page_source and password not in browser.page_source

        # a failure's job page: every field, its error and traceback
        failures.find_element("link text", "bad-1").click()
        assert loaded(browser, "job-state").text == "failed"
        error = browser.find_element("id", "last-error").text
        assert "card declined 1" in error and "Traceback" in error
        assert '"card declined 1"' in browser.find_element("id", "job-data").text
        assert password not in browser.page_source

        # requeue with its confirmation, the supervisor gone (the job then stays waiting)
        sup.kill_group()
        browser.get(f"{dash.url}queues/work?state=failed")
        assert {a.text for a in browser.find_elements("css selector", "#jobs td a")} >= {
            "bad-0",
            "bad-1",
        }
        row = browser.find_element("xpath", "//table[@id='jobs']//tr[td/a[text()='bad-0']]")
        row.find_element("link text", "Requeue…").click()
        assert "bad-0" in loaded(browser, "confirm-text").text
        assert work.get_job("bad-0").state == "failed"  # nothing happens before the confirmation
        browser.find_element("id", "confirm").click()
        assert loaded(browser, "done").text == "requeued 1 job"
        assert browser.find_element("id", "job-state").text == "waiting"
        assert work.get_job("bad-0").state == "waiting"
        assert work.get_job("bad-1").state == "failed"
        assert work.counts()["waiting"] == 1
        client.close()


def test_read_only_shows_no_action_and_refuses_a_forged_post(
    redis_url: str, prefix: str, tmp_path: Path, browser: Any
) -> None:
    client = Client(redis_url, workers=0, prefix=prefix)
    q = client.queue("mail")
    q.dispatch({"to": "a@example.com"}, id="m1")
    with dashboard(redis_url, prefix, tmp_path, "--read-only") as dash:
        browser.get(dash.url)  # the main page refreshes its counts by itself (/api/status)
        assert cells(browser, "mail")["waiting"] == 1
        q.dispatch({"to": "b@example.com"}, id="m2")
        wait_for(lambda: cells(browser, "mail")["waiting"] == 2, timeout=15, what="a refresh")
        browser.get(f"{dash.url}queues/mail?state=waiting")
        assert "read-only" in browser.find_element("tag name", "header").text
        assert [a.text for a in browser.find_elements("css selector", "#jobs td a")] == ["m1", "m2"]
        assert not browser.find_elements("css selector", ".button, form, #queue-actions")
        browser.get(f"{dash.url}queues/mail/jobs/m1")
        assert browser.find_element("id", "job-state").text == "waiting"
        assert not browser.find_elements("css selector", ".button, form")
        status, _, body = dash.request("GET", "/queues/mail/confirm?action=purge&state=all")
        assert status == 403 and "this dashboard is read-only" in body
        for action, form in (("purge", "state=waiting"), ("cancel", "id=m1")):
            status, _, body = dash.request(
                "POST",
                f"/queues/mail/actions/{action}",
                body=f"csrf=forged&{form}",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )
            assert status == 403 and "this dashboard is read-only" in body
    assert q.get_job("m1").state == "waiting"
    assert q.counts()["waiting"] == 2
    client.close()


def test_a_token_is_required_of_every_request(
    redis_url: str, prefix: str, tmp_path: Path, browser: Any
) -> None:
    with Client(redis_url, workers=0, prefix=prefix) as client:
        client.queue("q").dispatch({}, id="j")
    with dashboard(redis_url, prefix, tmp_path, **{"QUEASY_DASHBOARD_TOKEN": TOKEN}) as dash:
        assert TOKEN not in dash.log()
        for path in ("/", "/queues/q", "/api/status", "/static/app.js"):
            status, headers, _ = dash.request("GET", path)
            assert status == 401 and headers["www-authenticate"].startswith("Basic"), path
        wrong = {"Authorization": "Bearer not-the-token-at-all"}
        assert dash.request("GET", "/", headers=wrong)[0] == 401
        status, headers, _ = dash.request("GET", "/?token=not-the-token-at-all")
        assert status == 401 and "www-authenticate" not in headers
        assert dash.request("GET", "/", headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
        basic = base64.b64encode(f"admin:{TOKEN}".encode()).decode()
        assert (
            dash.request("GET", "/api/status", headers={"Authorization": f"Basic {basic}"})[0]
            == 200
        )
        status, headers, _ = dash.request("GET", f"/queues/q?state=waiting&token={TOKEN}")
        assert status == 303 and headers["location"] == "/queues/q?state=waiting"
        cookie = headers["set-cookie"].split(";")[0]
        assert TOKEN not in headers["set-cookie"] and "HttpOnly" in headers["set-cookie"]
        assert dash.request("GET", "/queues/q", headers={"Cookie": cookie})[0] == 200
        assert dash.request("GET", "/queues/q", headers={"Cookie": "queasy_auth=forged"})[0] == 401

        browser.delete_all_cookies()
        browser.get(f"{dash.url}?token=wrong-token-wrong-token")
        assert "401 unauthorized: wrong token" in browser.page_source
        browser.get(f"{dash.url}?token={TOKEN}")
        assert browser.current_url == dash.url  # the token left the address bar
        assert cells(browser, "q")["waiting"] == 1
        browser.get(f"{dash.url}queues/q")  # the cookie carries on
        assert browser.find_element("id", "queue-name").text == "q"
        assert TOKEN not in dash.log()
        browser.delete_all_cookies()


# --- plain HTTP: CSRF, origin, host, methods ----------------------------------------------------


def csrf_of(dash: Dash, path: str) -> tuple[str, str]:
    """The CSRF cookie a browser gets with a confirmation page, and the page's form token."""
    status, headers, body = dash.request("GET", path)
    assert status == 200, body
    cookie = re.search(r"(queasy_csrf=[^;]+)", headers["set-cookie"])
    token = re.search(r'name="csrf" value="([^"]+)"', body)
    assert cookie and token
    return cookie[1], token[1]


def test_actions_need_post_a_csrf_token_and_their_own_origin(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    client = Client(redis_url, workers=0, prefix=prefix)
    q = client.queue("q")
    for i in range(3):
        q.dispatch({"i": i}, id=f"j{i}")
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    with dashboard(redis_url, prefix, tmp_path) as dash:
        cookie, token = csrf_of(dash, "/queues/q/confirm?action=cancel&id=j0")
        other_cookie, _ = csrf_of(dash, "/queues/q/confirm?action=cancel&id=j0")
        path = "/queues/q/actions/cancel"
        refused = [
            ({**form}, f"csrf={token}&id=j0"),  # no cookie
            ({**form, "Cookie": cookie}, "id=j0"),  # no token
            ({**form, "Cookie": cookie}, "csrf=forged&id=j0"),
            ({**form, "Cookie": other_cookie}, f"csrf={token}&id=j0"),  # another browser's
            ({**form, "Cookie": cookie, "Origin": "http://evil.example"}, f"csrf={token}&id=j0"),
        ]
        for headers, body in refused:
            status, _, text = dash.request("POST", path, body=body, headers=headers)
            assert status == 403 and "CSRF" in text, (headers, body)
        assert (
            dash.request("GET", f"{path}?csrf={token}&id=j0", headers={"Cookie": cookie})[0] == 405
        )
        assert q.get_job("j0").state == "waiting"

        origin = f"http://127.0.0.1:{dash.port}"
        good = {**form, "Cookie": cookie, "Origin": origin}
        status, headers, _ = dash.request("POST", path, body=f"csrf={token}&id=j0", headers=good)
        assert status == 303 and headers["location"] == "/queues/q/jobs/j0?done=cancel&n=1"
        assert q.get_job("j0").state == "cancelled"
        status, headers, _ = dash.request(
            "POST", "/queues/q/actions/purge", body=f"csrf={token}&state=waiting", headers=good
        )
        assert status == 303 and headers["location"] == "/queues/q?done=purge&n=2"
        assert q.counts()["waiting"] == 0
        status, _, body = dash.request(
            "POST", "/queues/q/actions/purge", body=f"csrf={token}&state=active", headers=good
        )
        assert status == 400 and "purge needs a state" in body

        # a page of another site whose name resolves to 127.0.0.1 (DNS rebinding) is refused
        status, _, _ = dash.request("GET", "/api/status", headers={"Host": "evil.example"})
        assert status == 403
        status, headers, _ = dash.request("GET", "/", headers={"Host": f"localhost:{dash.port}"})
        assert status == 200
        assert "default-src 'self'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"
        assert dash.request("GET", "/queues/q?state=waiting&cursor=zzz")[0] == 200  # page 1
        assert dash.request("GET", "/queues/nope")[0] == 404
        assert dash.request("GET", "/queues/q/jobs/nope")[0] == 404
    client.close()


def test_a_cancel_of_an_active_ids_blocked_copy_says_the_active_job_runs_on(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """Cancel on the page of x, while x is active and a dispatch of x waits blocked behind it,
    cancels the blocked copy: the page said `cancelled 1 job` above a job shown active."""
    client = Client(redis_url, workers=0, prefix=prefix)
    q = client.queue("q")
    q.dispatch({}, id="x")
    lua = Lua(redis.Redis.from_url(redis_url, decode_responses=True), prefix)
    assert lua.dequeue(now=int(time.time() * 1000), expiry=600_000).ids == ["x"]
    q.dispatch({"again": 1}, id="x")  # blocked behind the active x
    assert q.get_job("x").state == "active" and q.counts()["blocked"] == 1  # type: ignore[union-attr]
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    with dashboard(redis_url, prefix, tmp_path) as dash:
        cookie, token = csrf_of(dash, "/queues/q/confirm?action=cancel&id=x")
        good = {**form, "Cookie": cookie, "Origin": f"http://127.0.0.1:{dash.port}"}
        status, headers, _ = dash.request(
            "POST", "/queues/q/actions/cancel", body=f"csrf={token}&id=x", headers=good
        )
        assert status == 303 and headers["location"] == "/queues/q/jobs/x?done=cancel&n=1"
        status, _, body = dash.request("GET", headers["location"])
        assert status == 200
        assert (
            '<p class="done" id="done">cancelled its blocked copy: the job that is active runs '
            "on (an active job is never cancelled)</p>"
        ) in body
        assert q.get_job("x").state == "active" and q.counts()["blocked"] == 0  # type: ignore[union-attr]
        # a job that did stop still reads as before
        q.dispatch({}, id="y")
        assert q.cancel("y")
        status, _, body = dash.request("GET", "/queues/q/jobs/y?done=cancel&n=1")
        assert '<p class="done" id="done">cancelled 1 job</p>' in body
    client.close()


def test_a_hand_made_done_count_is_ignored_not_a_500(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """`?done=purge&n=` took any str.isdigit() text: a superscript digit or more than 4300
    digits passed it and made int() raise, a 500 and a traceback in the log."""
    with Client(redis_url, workers=0, prefix=prefix) as client:
        client.queue("q").dispatch({}, id="j")
    with dashboard(redis_url, prefix, tmp_path) as dash:
        for n in ("%C2%B2", "9" * 5000, "%D9%A3"):
            status, _, body = dash.request("GET", f"/queues/q?done=purge&n={n}")
            assert status == 200 and 'id="done"' not in body, n
            assert dash.request("GET", f"/queues/q/jobs/j?done=cancel&n={n}")[0] == 200
        status, _, body = dash.request("GET", "/queues/q?done=purge&n=3")
        assert status == 200 and "purged 3 jobs" in body
        assert "Traceback" not in dash.log()


def test_the_token_link_of_a_job_id_with_a_percent_leads_to_that_job(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """The `?token=` redirect rebuilt the address from the decoded path: a job id holding
    `%` (`50%41`, quoted `50%2541` in the link) was sent on to `50%41`, which is job `50A`;
    and a path starting `//` became a redirect to another site."""
    with Client(redis_url, workers=0, prefix=prefix) as client:
        client.queue("q").dispatch({}, id="50%41")
    env = {"QUEASY_DASHBOARD_TOKEN": TOKEN}
    with dashboard(redis_url, prefix, tmp_path, **env) as dash:
        status, headers, _ = dash.request("GET", f"/queues/q/jobs/50%2541?x=1&token={TOKEN}")
        assert status == 303 and headers["location"] == "/queues/q/jobs/50%2541?x=1"
        cookie = headers["set-cookie"].split(";")[0]
        status, _, body = dash.request("GET", headers["location"], headers={"Cookie": cookie})
        assert status == 200 and 'id="job-id">50%41<' in body
        for path in ("//evil.example/x", "/\\evil.example/x", "///evil.example/x"):
            status, headers, _ = dash.request("GET", f"{path}?token={TOKEN}")
            assert status == 303 and headers["location"][1] not in "/\\", headers


def test_a_server_gone_is_one_clear_line_and_the_page_comes_back(tmp_path: Path) -> None:
    port, data = free_port(), tmp_path / "server"
    valkey = EmbeddedServer(port=port, data_dir=data, extra_args=AOF).start()
    try:
        with Client(valkey.url, workers=0, prefix="p") as client:
            client.queue("q").dispatch({}, id="j")
        with dashboard(valkey.url, "p", tmp_path) as dash:
            assert dash.request("GET", "/")[0] == 200
            valkey.stop()
            status, _, body = dash.request("GET", "/")
            assert status == 503 and "the Redis server cannot be used now" in body
            assert password_of(valkey.url) not in body
            valkey = EmbeddedServer(port=port, data_dir=data, extra_args=AOF).start()
            status, _, body = wait_for(
                lambda: (got := dash.request("GET", "/queues/q"))[0] == 200 and got,
                what="the dashboard reading the server again",
            )
            assert 'data-k="waiting">1<' in body
    finally:
        valkey.stop()


# --- where it may listen ------------------------------------------------------------------------


def test_where_it_may_listen(redis_url: str, prefix: str) -> None:
    """The command refuses in one line, before it connects; the rules themselves below."""
    done = subprocess.run(
        queasy("dashboard", "--redis", redis_url, "--prefix", prefix, "--host", "0.0.0.0"),
        env=command_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == exitcodes.CONFIG, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "refusing to serve the dashboard on 0.0.0.0 without a token" in lines[0]
    assert password_of(redis_url) not in done.stderr


@pytest.mark.parametrize(
    ("host", "token", "message"),
    [
        ("0.0.0.0", None, "without a token"),
        ("192.0.2.1", None, "without a token"),
        ("::", None, "without a token"),
        ("0.0.0.0", "short", "at least 16 characters"),
        ("127.0.0.1", "short", "at least 16 characters"),
    ],
)
def test_the_bind_rules(host: str, token: str | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        security.check_bind(host, token)


def test_loopback_needs_no_token_and_anything_else_with_one_is_allowed() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        security.check_bind(host, None)
    security.check_bind("0.0.0.0", TOKEN)


def test_a_port_in_use_is_a_config_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            server.listen_socket("127.0.0.1", port)
    with pytest.raises(ConfigError, match="--port must be 0..65535"):
        server.listen_socket("127.0.0.1", 70000)


def test_import_queasy_py_stays_without_the_web_extra() -> None:
    code = (
        "import sys, queasy_py, queasy_py.cli.main, queasy_py.web.security\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=command_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --- the chart's numbers and the bounded read of the last hour ---------------------------------


def test_the_chart_buckets_the_hour_by_minute_with_percentiles() -> None:
    now = 1_800_000_000.0
    end = int(now * 1000)

    def event(outcome: str, ago_s: float, wait: float, run: float) -> dict[str, Any]:
        ended = end - int(ago_s * 1000)
        started = ended - int(run * 1000)
        return {"outcome": outcome, "ended_at": ended, "started_at": started,
                "enqueued_at": started - int(wait * 1000), "run_at": 0}  # fmt: skip

    events = [event("finished", 30, 0.1 * i, 1.0 * i) for i in range(1, 21)]
    events += [event("failed", 90, 0, 2), event("timed_out", 90, 0, 60)]
    events += [event("finished", 3700, 0, 1)]  # older than the hour: left out
    events += [{"outcome": "cancelled", "ended_at": end - 10, "started_at": None}]
    rows = charts.buckets(events, now)
    assert (rows[-1].finished, rows[-1].failed, rows[-1].retried) == (20, 0, 0)
    assert (rows[-2].finished, rows[-2].failed, rows[-2].retried) == (0, 1, 1)
    assert charts.percentile(rows[-1].runs, 50) == pytest.approx(10.0)
    assert charts.percentile(rows[-1].runs, 95) == pytest.approx(19.0)
    assert charts.percentile(rows[-1].waits, 95) == pytest.approx(1.9)
    total = charts.summary(rows)
    assert (total["finished"], total["failed"], total["retried"]) == (20, 1, 1)
    svg = charts.throughput_svg(rows)
    assert 'data-finished="20"' in svg and svg.count('class="bar finished"') == 1


def test_history_recent_reads_the_newest_events_since_a_time(
    redis_url: str, prefix: str, r: redis.Redis
) -> None:
    client = Client(redis_url, workers=0, prefix=prefix)
    q = client.queue("q")
    for i in range(5):
        q.dispatch({}, id=f"j{i}")
        assert q.cancel(f"j{i}")  # each cancel writes an outcome event
    history = History(client)
    stream = history.stream("q")
    newest = history.recent(stream, since=0, count=3)
    assert [e["id"] for e in newest] == ["j2", "j3", "j4"]
    assert all(e["outcome"] == "cancelled" for e in newest)
    first_ms = int(q.events(count=1)[0]["event_id"].split("-")[0])
    assert history.recent(stream, since=(first_ms + 60_000) / 1000) == []
    assert len(history.recent(stream, since=first_ms / 1000)) == 5
    with pytest.raises(queasy_py.InvalidInput):
        history.recent(stream, since=-1)
    client.close()
