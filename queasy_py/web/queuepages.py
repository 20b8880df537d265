"""The dashboard's queue page (its jobs by state, a page at a time with the API's cursor), a
job's detail page, and the confirmation page of an action (requeue, cancel, purge)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import orjson

from ..job import JobInfo
from ..operate import LISTED, PURGED
from .pages import COLUMNS, ago, e, error_block, job_url, queue_url, when

#: what each action does, as the confirmation page and the result line say it
ACTIONS = ("requeue", "cancel", "purge")
CANCELLABLE = ("waiting", "delayed", "blocked")


def confirm_link(queue: str, action: str, **params: str) -> str:
    query = urlencode({"action": action, **params})
    return f"{queue_url(queue)}/confirm?{query}"


def button(href: str, label: str, kind: str = "") -> str:
    return f'<a class="button {kind}" href="{e(href)}">{e(label)}</a>'


def job_action(j: JobInfo, read_only: bool, kind: str = "") -> str:
    """The button of what may be done to this job: requeue a failed one, cancel one that
    waits; none in read-only mode."""
    if read_only:
        return ""
    if j.state == "failed":
        return button(confirm_link(j.queue, "requeue", id=j.id), "Requeue…", kind)
    if j.state in CANCELLABLE:
        return button(confirm_link(j.queue, "cancel", id=j.id), "Cancel…", kind)
    return ""


def counts_line(name: str, counts: dict[str, int]) -> str:
    cells = "".join(
        f"<div class=stat><span class=label>{e(label)}</span>"
        f'<span class=value data-q="{e(name)}" data-k="{key}">{counts.get(key, 0)}</span></div>'
        for key, label in COLUMNS
    )
    return f'<div class="stats">{cells}</div>'


def queue_actions(name: str) -> str:
    requeue = button(confirm_link(name, "requeue"), "Requeue all failed…")
    options = "".join(f"<option>{s}</option>" for s in (*PURGED, "all"))
    return (
        f'<div class="actions" id="queue-actions">{requeue}'
        f'<form method="get" action="{e(queue_url(name))}/confirm">'
        '<input type="hidden" name="action" value="purge">'
        f'<select name="state" aria-label="state to purge">{options}</select>'
        '<button type="submit" class="danger">Purge…</button></form></div>'
    )


def job_row(j: JobInfo, now: float, read_only: bool) -> str:
    action = job_action(j, read_only, "small")
    error = error_block(j.last_error) if j.last_error else ""
    return (
        f'<tr><td><a href="{e(job_url(j.queue, j.id))}">{e(j.id)}</a></td>'
        f"<td>{when(j.run_at)}</td><td>{ago(now, j.enqueued_at)}</td>"
        f"<td>{ago(now, j.started_at)}</td><td>{ago(now, j.ended_at)}</td>"
        f"<td class=num>{j.attempts}</td>"
        f"<td class=num>{j.retry_count}/{j.stall_count}/{j.timeout_count}</td>"
        f"<td class=error>{error}</td><td>{action}</td></tr>"
    )


def queue_page(
    name: str,
    counts: dict[str, int],
    state: str,
    jobs: list[JobInfo],
    cursor: str,
    next_cursor: str,
    now: float,
    read_only: bool,
) -> str:
    tabs = "".join(
        f'<a class="tab{" current" if s == state else ""}" '
        f'href="{e(queue_url(name))}?state={s}">{s} '
        f"<small>{counts.get(s, '') if s in counts else ''}</small></a>"
        for s in LISTED
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "job",
            "run at (UTC)",
            "dispatched",
            "started",
            "ended",
            "attempts",
            "retries/stalls/timeouts",
            "last error",
            "",
        )  # fmt: skip
    )
    rows = "".join(job_row(j, now, read_only) for j in jobs)
    table = (
        f'<table id="jobs" data-state="{state}"><thead><tr>{head}</tr></thead>{rows}</table>'
        if jobs
        else f'<p class="empty" id="jobs-empty">No {e(state)} job.</p>'
    )
    paging = []
    if cursor != "0":
        paging.append(f'<a href="{e(queue_url(name))}?state={state}">First page</a>')
    if next_cursor != "0":
        query = urlencode({"state": state, "cursor": next_cursor})
        paging.append(f'<a id="next-page" href="{e(queue_url(name))}?{e(query)}">Next page</a>')
    actions = "" if read_only else queue_actions(name)
    return (
        f'<h1>Queue <span id="queue-name">{e(name)}</span></h1>{counts_line(name, counts)}'
        f'{actions}<nav class="tabs">{tabs}</nav>{table}'
        f'<p class="paging">{" · ".join(paging)}</p>'
    )


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    except TypeError:
        return str(value)


def stamp(epoch: float | None, now: float) -> str:
    return f"{when(epoch)} <small>{ago(now, epoch)}</small>" if epoch else "–"


def job_page(j: JobInfo, now: float, read_only: bool) -> str:
    rows = [
        ("queue", f'<a href="{e(queue_url(j.queue))}">{e(j.queue)}</a>'),
        ("state", f'<b id="job-state">{e(j.state)}</b>'),
        ("run at", when(j.run_at)),
        ("dispatched", stamp(j.enqueued_at, now)),
        ("started", stamp(j.started_at, now)),
        ("ended", stamp(j.ended_at, now)),
        ("attempts", str(j.attempts)),
        ("retries", str(j.retry_count)),
        ("stalls", str(j.stall_count)),
        ("timeouts", str(j.timeout_count)),
        ("worker pid", e(j.worker_pid or "–")),
        ("supervisor", e(j.client or "–")),
        ("host", e(j.host or "–")),
    ]
    fields = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in rows)
    actions = job_action(j, read_only)
    error = ""
    if j.last_error:
        at = j.last_error.get("at")
        error = (
            f"<h2>Last error</h2><p>{e(j.last_error.get('kind'))} at {when(at)}</p>"
            f'<div id="last-error">{error_block(j.last_error, open_=True)}</div>'
        )
    data = "(not kept)" if j.data is None else _json(j.data)
    result = ""
    if j.result is not None:
        result = f'<h2>Result</h2><pre id="job-result">{e(_json(j.result))}</pre>'
    return (
        f'<h1>Job <span id="job-id">{e(j.id)}</span></h1>'
        f'<div class="actions">{actions}</div><dl class="fields">{fields}</dl>{error}'
        f'<h2>Data</h2><pre id="job-data">{e(data)}</pre>{result}'
    )


def describe(action: str, queue: str, counts: dict[str, int], job_id: str, state: str) -> str:
    """What an action will do, in the words of its confirmation page."""
    if action == "requeue" and job_id:
        return f"Requeue failed job {job_id} of {queue}: it is dispatched again to run now."
    if action == "requeue":
        return (f"Requeue every failed job of {queue} whose record is kept (keep_failed; "
                f"{counts.get('failed_last_hour', 0)} failed in the last hour): each is "
                "dispatched again to run now, its counts from 0.")  # fmt: skip
    if action == "cancel":
        return f"Cancel job {job_id} of {queue} (removed if waiting, delayed or blocked)."
    what = "every job but the active ones" if state == "all" else f"every {state} job"
    return f"Purge {what} of {queue}. This cannot be undone."


def confirm_page(queue: str, action: str, text: str, csrf: str, job_id: str, state: str) -> str:
    hidden = "".join(
        f'<input type="hidden" name="{k}" value="{e(v)}">'
        for k, v in (("csrf", csrf), ("id", job_id), ("state", state))
        if v
    )
    back = job_url(queue, job_id) if job_id else queue_url(queue)
    return (
        f'<h1>Confirm: {e(action)}</h1><p class="confirm" id="confirm-text">{e(text)}</p>'
        f'<form method="post" action="{e(queue_url(queue))}/actions/{e(action)}">{hidden}'
        f'<button type="submit" id="confirm" class="danger">Yes, {e(action)}</button> '
        f'<a href="{e(back)}" id="cancel-confirm">No, go back</a></form>'
    )
