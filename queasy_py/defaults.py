"""The one source of defaults. The README quotes this file; change both together."""

from __future__ import annotations

import os
from typing import Any

#: key prefix of every Redis key queasy_py writes
PREFIX = "queasy"
#: suffix of a queue's fail queue name (the fail queue shares the queue's hash tag)
FAIL_QUEUE_SUFFIX = "-fail"
#: the largest JSON-encoded job data accepted by dispatch, in bytes
MAX_PAYLOAD_BYTES = 1024 * 1024
#: entries kept in a queue's outcome-event stream (approximate MAXLEN; 0 turns events off)
EVENTS_MAXLEN = 100_000
#: records of ended jobs kept per queue and state (get_job, jobs(), result()): the newest
#: `count`, for at most `seconds` (a count of 0 keeps none). Finished records hold the data
#: (and a stored result), failed ones the data and the error with its traceback
KEEP_FINISHED: dict[str, Any] = {"count": 1000, "seconds": 3600.0}
KEEP_FAILED: dict[str, Any] = {"count": 1000, "seconds": 604800.0}
#: cancelled records (Queue.cancel keeps them; a producer has no listen() options)
KEEP_CANCELLED: dict[str, Any] = KEEP_FINISHED
#: bytes of a handler's traceback a worker keeps (its end), and of that an event keeps
TRACEBACK_BYTES = 8192
EVENT_TRACEBACK_BYTES = 1024
#: seconds a queue's dispatches go on without writing its name to the registry of queues
#: (`<prefix>:queues`, Client.queues) after that write found its Redis Cluster primary down:
#: the next dispatch after them tries again (one server: the dispatch raises instead)
REGISTRY_RETRY = 30.0
#: seconds a producer's call on a Redis Cluster waits out a moving or unserved slot (TRYAGAIN,
#: ASK, CLUSTERDOWN) before it raises (store/cluster.py ClusterClient.slot_wait)
SLOT_WAIT = 10.0
#: attempts and first backoff (seconds, doubling) when connecting to Redis
CONNECT_ATTEMPTS = 3
CONNECT_BACKOFF = 0.2
#: seconds every connection of the producer API (Client, AsyncClient, their cluster clients,
#: the CLI's) waits to connect, and for one reply: a frozen server fails a call after that
#: with a clear error, whatever redis-py's own default (none before redis-py 8: forever)
CONNECT_TIMEOUT = 5.0
SOCKET_TIMEOUT = 5.0
#: the most connections one producer client opens at once (a call in flight, a result()
#: waiting, each holds one): the server's own default maxclients. redis-py 6+ caps a pool at
#: 100 and refuses the 101st concurrent call at once ('Too many connections': threads of a
#: web server, a gather of coroutines); its cluster clients allow 2**31
MAX_CONNECTIONS = 10_000
#: the longest result() waits on what wakes it (the job's channel, the queue's outcome events)
#: before it looks at the job and the supervisors' registry again: the latest it sees an end
#: that woke nothing (run by a supervisor without store_results that started during the wait,
#: or on a queue with events off), and then waits on what that supervisor announces
RESULT_RECHECK = 5.0
#: how long `queasy run` keeps retrying an unreachable Redis at start (seconds)
RUN_CONNECT_TIMEOUT = 120.0
#: environment variable read when no URL is given
URL_ENV = "QUEASY_REDIS_URL"
#: environment variable of the key prefix (set for worker processes by their supervisor)
PREFIX_ENV = "QUEASY_PREFIX"
#: environment variable of the workers' logging level (set by their supervisor: its own)
LOG_LEVEL_ENV = "QUEASY_LOG_LEVEL"
#: log line format of the `queasy` command and of every worker process
LOG_FORMAT = "%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s"
#: environment variable naming the embedded server's data directory (README "Where it runs")
DATA_DIR_ENV = "QUEASY_DATA_DIR"
#: the embedded server's data directory inside a project directory (the first one holding a
#: pyproject.toml, walking up from the working directory)
STATE_DIR_NAME = ".queasy"
#: seconds between the embedded server keeper's checks whether any process still uses it
KEEPER_POLL_INTERVAL = 0.1
#: seconds a process waits for the project's embedded server to start (or to stop, at close)
EMBEDDED_START_TIMEOUT = 30.0
#: the keeper starts a valkey-server that died under its users (the OOM killer, a crash) again,
#: at most this many times within KEEPER_RESTART_WINDOW seconds; one death more, it stops
KEEPER_RESTARTS = 3
KEEPER_RESTART_WINDOW = 60.0
#: capacity units of one worker process
WORKER_UNITS = 100
#: seconds the scheduling loop waits on one Redis call at most (its own connections; a frozen
#: or refusing Redis never stops the loop for longer)
LOOP_REDIS_TIMEOUT = 2.0
#: seconds a new worker has to import its handlers and say "ready" before it is killed
WORKER_START_TIMEOUT = 60.0
#: seconds a worker that a timeout made unhealthy, still running jobs that did not time out,
#: has to answer a ping: one that does not (a timed-out job holds its GIL in C code, so none
#: of its jobs can go on) is killed, those jobs handed back, not counted
WORKER_PING_TIMEOUT = 2.0
#: seconds after its run_at during which an id dispatched by the Spark sink (or
#: Queue.dispatch_batch(dedup_window=...)) is not dispatched again: a retried task or a re-run
#: of the whole write does not run it a second time
DEDUP_WINDOW = 86400.0
#: workers in a row that die (or time out) before "ready": the supervisor then gives up and
#: exits with its HANDLER code, the import error logged once
WORKER_START_FAILURES = 5

#: the job id of a schedule's occurrence (listen(schedule=...)); lua/queasy.lua SCHEDULE_ID
SCHEDULE_ID = "schedule"
#: seconds after its fire time by which a schedule's occurrence must be able to start; a fire
#: time passed by more than this (everything down, the previous occurrence still running) is
#: missed, and `catch_up` decides
SCHEDULE_GRACE = 1.0
#: the values of listen(catch_up=...): run once now for the missed fire times, or skip them
CATCH_UP = ("once", "skip")

#: keyword arguments of Queue.listen() and their defaults
LISTEN: dict[str, Any] = {
    "size": 10,
    "priority": 100,
    "timeout": 60.0,
    "max_retries": 10,
    "max_stalls": 3,
    "max_timeouts": 3,
    "min_backoff": 2.0,
    "max_backoff": 300.0,
    "fail_handler": None,
    "fail_options": None,
    "events_maxlen": EVENTS_MAXLEN,
    "keep_finished": KEEP_FINISHED,
    "keep_failed": KEEP_FAILED,
    "store_results": False,
    "schedule": None,  # a cron expression: 5 fields, or 6 with seconds first
    "schedule_every": None,  # seconds between fire times (from the epoch), instead of cron
    "timezone": "UTC",  # of the cron expression (an IANA name)
    "catch_up": "once",  # missed fire times: "once" (run once now) or "skip"
}

#: the listen() keywords of a schedule (not options of a fail queue)
SCHEDULE_KEYS = ("schedule", "schedule_every", "timezone", "catch_up")

#: options of a fail queue (its jobs run the fail handler); listen(fail_options=...) overrides
FAIL_OPTIONS: dict[str, Any] = {
    "max_retries": 100,
    "min_backoff": 10.0,
    "max_backoff": 900.0,
    "size": 2,
}

#: supervisor settings: Client(...) keywords and the top-level keys of `queasy run` config
SUPERVISOR: dict[str, Any] = {
    "workers": None,  # None: os.cpu_count()
    "heartbeat_interval": 5.0,  # seconds; the expiry is twice this
    "shutdown_timeout": 30.0,  # seconds to wait for running jobs on SIGTERM/SIGINT
    "max_jobs_per_worker": 0,  # 0: never recycle a worker by job count
    "max_worker_memory": 0,  # bytes of RSS; 0: never recycle by memory
    "poll_interval": 1.0,  # seconds: the longest sleep without a wake-up message
    "metrics_port": None,  # Prometheus /metrics on this port (0: any free one); None: off
    "metrics_host": "127.0.0.1",  # the address /metrics is served on
}

#: the shortest heartbeat_interval: its expiry (twice it) must outlast a loaded machine's
#: scheduling hiccups, or every supervisor sweeps the others' jobs as dead
MIN_HEARTBEAT_INTERVAL = 0.1

#: upper bounds (seconds) of the buckets of the wait-time and run-time histograms of /metrics
#: (kept on two lines: the README quotes them as written)
METRICS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0, 900.0, 3600.0)  # fmt: skip
#: seconds a /metrics scrape may spend reading queue counts: no read starts after them (a
#: frozen server makes each read wait out its socket timeout; the gauges of the queues left
#: are absent from that scrape, which stays within Prometheus' scrape_timeout, 10 s)
METRICS_COUNTS_BUDGET = 1.0
#: /metrics' own HTTP serving (runtime/scrapes.py): scrapes answered at once (a fixed pool
#: of threads in the supervisor's process), connections held open at most (past it the
#: oldest one still sending its request is closed), seconds a client has to send its request
#: head and then to read the reply (a slow or idle one is closed), and the largest request
#: head read, in bytes (a larger one is answered 431 and closed)
METRICS_SCRAPES = 2
METRICS_CONNECTIONS = 32
METRICS_CLIENT_TIMEOUT = 5.0
METRICS_HEAD_BYTES = 8192


def default_workers() -> int:
    return os.cpu_count() or 1


#: `queasy dashboard`: where it listens (a loopback address; any other needs a token), the
#: environment variable of its token, the jobs on one page, the outcome events it reads per
#: queue for the last hour's chart (the newest), and seconds between its page's refreshes
DASHBOARD_HOST = "127.0.0.1"
DASHBOARD_PORT = 8080
DASHBOARD_TOKEN_ENV = "QUEASY_DASHBOARD_TOKEN"
DASHBOARD_PAGE = 50
DASHBOARD_EVENTS = 10_000
DASHBOARD_REFRESH = 5.0
#: seconds a dashboard client has to send a whole request (head and body) once connected or
#: after the previous reply: an idle or slow connection is closed then (uvicorn has no such
#: limit of its own; its keep-alive timeout only counts once a reply is sent)
DASHBOARD_CLIENT_TIMEOUT = 5.0
