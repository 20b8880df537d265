"""Opening a Redis connection: bounded retries, clear errors, passwords never shown."""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .. import defaults
from ..errors import AuthenticationFailed, ConnectionFailed, QueasyError

log = logging.getLogger("queasy_py")


def mask_url(url: str) -> str:
    """The URL with its password replaced by ***, safe to log."""
    parts = urlsplit(url)
    if parts.password is not None:
        user = parts.username or ""
        host = parts.hostname or ""
        if ":" in host:  # IPv6
            host = f"[{host}]"
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        url = urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    # redis-py also takes the password as a query argument: ?password=...
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", url)


def connect(
    url: str,
    attempts: int = defaults.CONNECT_ATTEMPTS,
    backoff: float = defaults.CONNECT_BACKOFF,
) -> redis.Redis:
    """A connected redis.Redis (bytes responses), or ConnectionFailed naming the masked URL."""
    try:
        r = redis.Redis.from_url(url, socket_connect_timeout=5.0, socket_keepalive=True)
    except ValueError as exc:
        raise ConnectionFailed(f"invalid Redis URL {mask_url(url)}: {exc}") from None
    delay = backoff
    for attempt in range(1, attempts + 1):
        try:
            r.ping()
            return r
        except redis.AuthenticationError as exc:
            r.close()
            raise AuthenticationFailed(
                f"Redis at {mask_url(url)} refused the credentials: {exc}"
            ) from None
        except redis.ResponseError as exc:
            if "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
                r.close()
                raise AuthenticationFailed(
                    f"Redis at {mask_url(url)} refused the credentials: {exc}"
                ) from None
            r.close()
            raise QueasyError(f"Redis at {mask_url(url)} answered PING with {exc}") from None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            if attempt == attempts:
                r.close()
                raise ConnectionFailed(
                    f"cannot connect to Redis at {mask_url(url)} after {attempts} attempts: {exc}"
                ) from None
            log.warning(
                "cannot connect to Redis at %s (attempt %d of %d): %s; retrying in %.1fs",
                mask_url(url),
                attempt,
                attempts,
                exc,
                delay,
            )
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def new_client_id() -> str:
    """A client's id in Redis (the owner of its leases): pid and 12 random hex digits."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def loop_client(url: str, timeout: float = defaults.LOOP_REDIS_TIMEOUT) -> redis.Redis:
    """A client for calls made by the scheduling loop and its threads: it connects lazily,
    every call gives up after `timeout` seconds, and redis-py does not retry on its own (the
    caller backs off and decides whether a command may be sent again)."""
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        socket_keepalive=True,
        retry=Retry(NoBackoff(), 0),
    )
