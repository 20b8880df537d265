"""The dashboard as a Starlette app: pages (GET), actions (POST, confirmed, CSRF-checked,
absent in read-only mode) and the JSON the page's script refreshes itself from. Every read
and action goes through the public API (web/data.py's Reader); endpoints are plain functions,
run in Starlette's thread pool (the client is redis-py's, thread-safe)."""

from __future__ import annotations

from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import redis
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from .. import defaults
from ..client import Client
from ..errors import InvalidInput, QueasyError
from ..operate import LISTED, PURGED
from ..reach import Reach
from ..store.connection import mask_url
from . import pages, queuepages
from .charts import charts_html
from .data import Reader
from .security import AUTH_COOKIE, CSRF_COOKIE, HEADERS, Guard

STATIC = {
    "app.css": "text/css; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
}
#: the largest form body an action accepts (its fields are a token, an id and a state)
MAX_FORM = 4096


class Dashboard:
    """The state of one dashboard: its client's reads, its guard, its mode."""

    def __init__(self, client: Client, guard: Guard, read_only: bool, page_size: int) -> None:
        self.reader = Reader(client)
        self.guard = guard
        self.read_only = read_only
        self.page_size = page_size
        self.server = f"{mask_url(client.url)} · prefix {client.prefix}"

    def html(self, request: Request, title: str, body: str, status: int = 200,
             refresh: float = 0) -> HTMLResponse:  # fmt: skip
        text = pages.layout(
            title, body, server=self.server, read_only=self.read_only, refresh=refresh
        )
        return HTMLResponse(text, status_code=status)

    def not_found(self, request: Request, what: str) -> HTMLResponse:
        return self.html(request, "not found", pages.message_page("Not found", what), 404)


def csrf_cookie(request: Request) -> str:
    """This browser's CSRF cookie (made by the middleware when it had none)."""
    return request.cookies.get(CSRF_COOKIE) or request.state.new_csrf


# ------------------------------------------------------------------ pages


def main(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    view = d.reader.overview()
    return d.html(request, "dashboard", pages.main_page(view), refresh=defaults.DASHBOARD_REFRESH)


def queue(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    name = request.path_params["name"]
    q = d.reader.queue(name)
    if q is None:
        return d.not_found(request, f"no queue named {name!r} under this prefix")
    state = request.query_params.get("state", "waiting")
    cursor = request.query_params.get("cursor", "0")
    if state not in LISTED:
        state = "waiting"
    try:
        jobs, next_cursor = q.jobs(state, cursor=cursor, limit=d.page_size)
    except (InvalidInput, redis.ResponseError):  # a cursor made by hand: the first page
        if cursor == "0":
            raise
        cursor = "0"
        jobs, next_cursor = q.jobs(state, cursor=cursor, limit=d.page_size)
    counts = q.counts()
    body = queuepages.queue_page(
        name, counts, state, jobs, cursor, next_cursor, d.reader.server_now(), d.read_only
    )
    return d.html(request, name, _done(request) + body)


def _done(request: Request, state: str | None = None) -> str:
    """The line saying what an action just did (from fixed words and numbers only). On the
    page of a job that is `state` now: a cancel of an id whose job is active cancelled the
    copy blocked behind it (singleton by id; an active job is never cancelled)."""
    action, n = request.query_params.get("done"), request.query_params.get("n", "")
    if action not in queuepages.ACTIONS or not (n.isascii() and n.isdigit()) or len(n) > 18:
        return ""
    words = {"requeue": "requeued", "cancel": "cancelled", "purge": "purged"}[action]
    if action == "cancel" and n == "1" and state == "active":
        return (
            '<p class="done" id="done">cancelled its blocked copy: the job that is active '
            "runs on (an active job is never cancelled)</p>"
        )
    return f'<p class="done" id="done">{words} {int(n)} job{"" if n == "1" else "s"}</p>'


def job(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    name, job_id = request.path_params["name"], request.path_params["job_id"]
    q = d.reader.queue(name)
    info = None
    if q is not None:
        try:
            info = q.get_job(job_id)
        except InvalidInput:
            info = None
    if info is None:
        return d.not_found(request, f"no job {job_id!r} kept in queue {name!r}")
    page = queuepages.job_page(info, d.reader.server_now(), d.read_only)
    return d.html(request, f"job {job_id}", _done(request, info.state) + page)


def confirm(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    if d.read_only:
        return read_only_refusal(d, request)
    name = request.path_params["name"]
    q = d.reader.queue(name)
    if q is None:
        return d.not_found(request, f"no queue named {name!r} under this prefix")
    action = request.query_params.get("action", "")
    job_id = request.query_params.get("id", "")
    state = request.query_params.get("state", "")
    problem = _action_problem(action, job_id, state)
    if problem:
        return d.html(request, "bad request", pages.message_page("Bad request", problem), 400)
    text = queuepages.describe(action, name, q.counts(), job_id, state)
    token = d.guard.csrf_token(csrf_cookie(request))
    body = queuepages.confirm_page(name, action, text, token, job_id, state)
    return d.html(request, f"confirm {action}", body)


def _action_problem(action: str, job_id: str, state: str) -> str | None:
    if action not in queuepages.ACTIONS:
        return f"unknown action {action!r} (one of {', '.join(queuepages.ACTIONS)})"
    if action == "cancel" and not job_id:
        return "cancel needs a job id"
    if action == "purge" and state not in (*PURGED, "all"):
        return f"purge needs a state: one of {', '.join(PURGED)} or all"
    return None


# ------------------------------------------------------------------ actions


def read_only_refusal(d: Dashboard, request: Request) -> Response:
    text = "this dashboard is read-only (--read-only): it takes no action"
    return d.html(request, "read-only", pages.message_page("Read-only", text), 403)


async def act(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    if d.read_only:
        return read_only_refusal(d, request)
    body = await request.body()
    if len(body) > MAX_FORM:
        return d.html(request, "too large", pages.message_page("Too large", "form too large"), 413)
    form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    origin_ok = d.guard.origin_ok(
        request.headers.get("origin"), request.url.scheme, request.headers.get("host", "")
    )
    if not origin_ok or not d.guard.csrf_ok(request.cookies.get(CSRF_COOKIE), form.get("csrf")):
        text = "the form's CSRF token or origin did not match: reload the page and try again"
        return d.html(request, "forbidden", pages.message_page("Forbidden", text), 403)
    action = request.path_params["action"]
    job_id, state = form.get("id", ""), form.get("state", "")
    problem = _action_problem(action, job_id, state)
    if problem:
        return d.html(request, "bad request", pages.message_page("Bad request", problem), 400)
    return await run_in_threadpool(_apply, d, request, action, job_id, state)


def _apply(d: Dashboard, request: Request, action: str, job_id: str, state: str) -> Response:
    name = request.path_params["name"]
    q = d.reader.queue(name)
    if q is None:
        return d.not_found(request, f"no queue named {name!r} under this prefix")
    try:
        if action == "requeue":
            n = q.requeue_failed([job_id] if job_id else None)
        elif action == "cancel":
            n = int(q.cancel(job_id))
        else:
            n = q.purge(state)
    except InvalidInput as exc:
        return d.html(request, "bad request", pages.message_page("Bad request", str(exc)), 400)
    target = pages.job_url(name, job_id) if job_id else pages.queue_url(name)
    return RedirectResponse(f"{target}?{urlencode({'done': action, 'n': n})}", status_code=303)


# ------------------------------------------------------------------ JSON and assets


def status(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    return JSONResponse({**d.reader.status(), "read_only": d.read_only})


def charts(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    reach = Reach(d.reader.client)
    queues = d.reader.queues(reach)
    now = reach.server_time()
    events, _ = d.reader.hour_events(queues, now, reach)
    return HTMLResponse(charts_html(events, now))


def static(request: Request) -> Response:
    name = request.path_params["file"]
    if name not in STATIC:
        return Response("not found", status_code=404, media_type="text/plain")
    text = resources.files(__package__).joinpath("static", name).read_bytes()
    return Response(text, media_type=STATIC[name])


# ------------------------------------------------------------------ the rules of every request


class Rules(BaseHTTPMiddleware):
    """Host, token and CSRF cookie of every request; security headers on every response."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        d: Dashboard = request.app.state.dashboard
        guard = d.guard
        response = await self._check(request, call_next, guard)
        for key, value in HEADERS.items():
            response.headers.setdefault(key, value)
        return response

    async def _check(
        self, request: Request, call_next: RequestResponseEndpoint, guard: Guard
    ) -> Response:
        if not guard.host_allowed(request.headers.get("host", "")):
            return Response("host not allowed: open the dashboard as 127.0.0.1 or localhost",
                            status_code=403, media_type="text/plain")  # fmt: skip
        given = request.query_params.get("token")
        if given is not None and guard.token is not None:
            if not guard.token_matches(given):  # said on the page, no login prompt
                return unauthorized("wrong token", challenge=False)
            query = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            url = own_path(request) + (f"?{urlencode(query)}" if query else "")
            response: Response = RedirectResponse(url, status_code=303)
            set_cookie(response, request, AUTH_COOKIE, guard.auth_cookie())
            return response
        if not guard.authorized(request.headers, request.cookies):
            return unauthorized("a token is needed (--token)")
        if request.method not in ("GET", "HEAD", "POST"):
            return Response("method not allowed", status_code=405, media_type="text/plain")
        request.state.new_csrf = guard.new_csrf_cookie()
        response = await call_next(request)
        if CSRF_COOKIE not in request.cookies:
            set_cookie(response, request, CSRF_COOKIE, request.state.new_csrf)
        return response


def own_path(request: Request) -> str:
    """The path as the browser sent it (still percent-encoded: a job id may hold `%`), with
    one leading slash (`//host/...` or `/\\host/...` would send a browser to another site)."""
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if raw else quote(request.url.path)
    return "/" + path.replace("\\", "%5C").lstrip("/")


def set_cookie(response: Response, request: Request, name: str, value: str) -> None:
    secure = request.url.scheme == "https"
    response.set_cookie(name, value, httponly=True, samesite="strict", secure=secure)


def unauthorized(text: str, challenge: bool = True) -> Response:
    """401; with a basic-auth challenge, a browser asks for a user and password (the token)."""
    realm = {"WWW-Authenticate": 'Basic realm="queasy dashboard", charset="UTF-8"'}
    return Response(
        f"401 unauthorized: {text}",
        status_code=401,
        media_type="text/plain",
        headers=realm if challenge else None,
    )


def unavailable(request: Request, exc: Exception) -> Response:
    """The server cannot be reached (or refused): one line, 503, the next refresh tries again."""
    d: Dashboard = request.app.state.dashboard
    text = f"the Redis server cannot be used now: {type(exc).__name__}: {exc}"
    return d.html(request, "unavailable", pages.message_page("Unavailable", text), 503)


def create_app(
    client: Client,
    *,
    token: str | None = None,
    read_only: bool = False,
    page_size: int = defaults.DASHBOARD_PAGE,
) -> Starlette:
    """The dashboard app of `client` (its server and prefix). `token`: required of every
    request (see web/security.py); `read_only`: no action is shown or taken."""
    routes: list[Any] = [
        Route("/", main),
        Route("/queues/{name}", queue),
        Route("/queues/{name}/jobs/{job_id:path}", job),
        Route("/queues/{name}/confirm", confirm),
        Route("/queues/{name}/actions/{action}", act, methods=["POST"]),
        Route("/api/status", status),
        Route("/api/charts", charts),
        Route("/static/{file}", static),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Rules)],
        exception_handlers={redis.RedisError: unavailable, QueasyError: unavailable},
    )
    app.state.dashboard = Dashboard(client, Guard(token), read_only, page_size)
    return app
