"""Opening a Redis connection: bounded retries, clear errors, passwords never shown."""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from typing import Any, TypeVar
from urllib.parse import unquote_plus, urlsplit

from .. import defaults
from ..errors import AuthenticationFailed, ConfigError, ConnectionFailed, QueasyError
from .lazyredis import redis  # imported by the first connection, not by this module

log = logging.getLogger("queasy_py")

R = TypeVar("R")


#: the URL schemes redis-py connects with
SCHEMES = ("redis", "rediss", "unix")
#: the URL schemes of a cluster, and the plain scheme each stands for (store/cluster.py)
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
#: what may follow the `@` that ends the credentials: a host (name, IPv4 or [IPv6]) and port
_HOST_AFTER_AT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]*)(:[^/?#@]*)?(?=$|[/?#])")
#: connection arguments that hold secrets (password, ssl_password, ...)
_SECRET_KEY = re.compile(r"password|secret|token", re.IGNORECASE)
#: query keys that hold secrets (redis-py: password=, ssl_password=, ...)
_SECRET_QUERY_KEY = re.compile(r"(?:password|secret|token)$", re.IGNORECASE)
#: a query argument: its key and its value (to the next `&` or `;`, a `#` in it included)
_QUERY_ARG = re.compile(r"([?&;])([^=&;#]*)=([^&;]*)")


def _credentials(url: str, in_query: bool = True) -> tuple[int, int] | None:
    """Where the credentials are: the span between `://` and the last `@` before the host
    (None without an `@`). in_query=False skips an `@` inside a query value (`?k=..@..`).
    For masking (in_query=True), when no `@` is followed by a host that parses (a typo:
    `bad!host`, `[::1`, a space), the span ends at the last `@`: a malformed URL is masked
    the more, never shown with its password."""
    start = url.find("://")
    start = 0 if start < 0 else start + 3  # no scheme: a malformed URL, masked all the same
    at, last = len(url), None
    while (at := url.rfind("@", start, at)) >= 0:
        query = url.find("?", start, at)
        if not in_query and query >= 0 and "=" in url[query:at]:
            continue
        if _HOST_AFTER_AT.match(url, at + 1):
            return start, at
        if last is None and in_query:
            last = at
    return None if last is None else (start, last)


def mask_url(url: str) -> str:
    """The URL with its secrets replaced by ***, safe to log and to put in an exception.

    Everything between `://` and the last `@` before the host is masked but a user name
    (`redis://user:***@host`; `redis://***@host` without a `:`), even a password holding
    `#`, `/`, `?` or `@`; so is the value of every query key ending in `password`, `secret`
    or `token` (`?ssl_password=***`).
    """
    span = _credentials(url)  # up to the last `@` when no host after one parses (a typo)
    if span is not None:
        start, at = span
        user, colon, _ = url[start:at].partition(":")
        shown = f"{user}:***" if colon and not any(c in user for c in "/?#") else "***"
        url = url[:start] + shown + url[at:]
    return _QUERY_ARG.sub(_mask_query_arg, url)


def _mask_query_arg(arg: re.Match[str]) -> str:
    """A query argument with `***` for its value when its key, as redis-py reads it
    (percent- and plus-decoded: `pass%77ord` is `password`), ends in password, secret or
    token."""
    sep, key, _ = arg.groups()
    if not _SECRET_QUERY_KEY.search(unquote_plus(key)):
        return arg.group(0)
    return f"{sep}{key}=***"


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


def check_url(url: str) -> None:
    """ConfigError (not an outage: never retried) for a URL redis-py would refuse or misread.

    A password holding an unencoded `/`, `?` or `#` ends the host part early for a URL
    parser, which then takes part of the password for the host or port.
    """
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme in CLUSTER_SCHEMES:
        from .clusterurl import parse_cluster_url

        parse_cluster_url(url)  # ConfigError naming what is wrong
        return
    if scheme not in SCHEMES:
        raise ConfigError(
            f"invalid Redis URL {mask_url(url)}: it must start with "
            f"{', '.join(s + '://' for s in SCHEMES)}"
        )
    span = _credentials(url, in_query=False)
    if span is not None and any(c in url[span[0] : span[1]] for c in "/?#"):
        raise ConfigError(
            f"invalid Redis URL {mask_url(url)}: its credentials hold '/', '?' or '#'; "
            "percent-encode them (%2F %3F %23, and %40 for '@', %3A for ':')"
        )


def connect(
    url: str,
    attempts: int = defaults.CONNECT_ATTEMPTS,
    backoff: float = defaults.CONNECT_BACKOFF,
) -> redis.Redis:
    """A connected redis.Redis (bytes responses), or ConnectionFailed naming the masked URL.

    A URL that does not parse is a ConfigError, raised at once (retrying cannot help).
    """
    r = producer_client(url)
    try:
        wait_reachable(r, url, attempts, backoff)
    except BaseException:
        r.close()
        raise
    return r


def plain_url(url: str) -> bool:
    """True for a `redis://` or `unix://` URL without options (no `?`, no `#`) whose host
    and port parse: redis-py's from_url cannot refuse it (after check_url), so its client can
    wait for its first use and redis-py's import with it. False for every other URL (TLS, a
    cluster, options, a bad port): from_url reads it at once, as before."""
    if not url.startswith(("redis://", "unix://")) or "?" in url or "#" in url:
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- ValueError for a port redis-py refuses
        parts.hostname  # noqa: B018
    except ValueError:
        return False
    return True


def producer_client(url: str) -> redis.Redis:
    """A redis.Redis for the producer API; it connects on its first command (from_url checks
    the URL at once). A library call that finds the library gone (a server restarted empty,
    FUNCTION FLUSH) loads it and is sent again (store/reloading.py)."""
    from .reloading import ReloadingRedis

    client = from_url(ReloadingRedis, url, **producer_options())
    client.where = f"Redis at {mask_url(url)}"
    return client


def producer_options() -> dict[str, Any]:
    """The socket options of every producer connection (a URL's own `?socket_timeout=`...
    win over them): bounded whatever redis-py's defaults."""
    return {
        "socket_connect_timeout": defaults.CONNECT_TIMEOUT,
        "socket_timeout": defaults.SOCKET_TIMEOUT,
        "socket_keepalive": True,
        "max_connections": defaults.MAX_CONNECTIONS,
    }


def wait_reachable(
    r: redis.Redis,
    url: str,
    attempts: int = defaults.CONNECT_ATTEMPTS,
    backoff: float = defaults.CONNECT_BACKOFF,
) -> None:
    """PING `r` up to `attempts` times (backoff doubling): ConnectionFailed naming the masked
    URL if it never answers, AuthenticationFailed at once for refused credentials. With one
    attempt nothing is logged (the caller retries and logs once per try)."""
    delay = backoff
    for attempt in range(1, attempts + 1):
        try:
            r.ping()
            return
        except redis.AuthenticationError as exc:
            raise AuthenticationFailed(
                f"Redis at {mask_url(url)} refused the credentials: {exc}"
            ) from None
        except redis.ResponseError as exc:
            if "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
                raise AuthenticationFailed(
                    f"Redis at {mask_url(url)} refused the credentials: {exc}"
                ) from None
            raise QueasyError(f"Redis at {mask_url(url)} answered PING with {exc}") from None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            r.connection_pool.disconnect()
            if attempt == attempts:
                tries = f" after {attempts} attempts" if attempts > 1 else ""
                raise ConnectionFailed(
                    f"cannot connect to Redis at {mask_url(url)}{tries}: {exc}"
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


def from_url(cls: type[R], url: str, **kwargs: Any) -> R:
    """cls.from_url(url, **kwargs) (redis.Redis or redis.asyncio.Redis; every connection of
    queasy_py is made here), with URL errors as a ConfigError naming the masked URL (redis-py's
    own message may quote part of the password) and TLS host names checked."""
    check_url(url)
    if "+cluster://" in url[:16].lower():
        raise ConfigError(
            f"{mask_url(url)}: a Redis Cluster URL serves Client (its producer API and run()), "
            "AsyncClient and `queasy run`, not a single-server connection; use a "
            "standalone Redis or Valkey there"
        )
    if url[:7].lower() == "unix://":
        kwargs.pop("socket_keepalive", None)  # TCP only: redis-py refuses it for a unix socket
    if url[:9].lower() == "rediss://":
        # verify the certificate's name (redis-py 5 did not by default); the URL's own
        # ?ssl_check_hostname= wins, and ssl_cert_reqs=none turns it off
        kwargs.setdefault("ssl_check_hostname", True)
    try:
        if url.partition("://")[0] != url.partition("://")[0].lower():
            # redis-py's sync client refuses REDIS://, its async one took it: refused alike
            raise ValueError("an upper-case scheme")
        client = cls.from_url(url, **kwargs)  # type: ignore[attr-defined]
    except ValueError as exc:
        raise ConfigError(
            f"invalid Redis URL {mask_url(url)} ({type(exc).__name__}; the details are not "
            "shown as they may quote the password): expected "
            "redis[s]://[[user]:password@]host[:port][/db][?option=value...], "
            "with special characters of the password percent-encoded"
        ) from None
    _check_options(client, url)
    return client  # type: ignore[no-any-return]


def _check_options(client: Any, url: str) -> None:
    """ConfigError for a URL option redis-py takes from the URL but refuses only when it makes
    a connection (an unknown `?key=`, a TLS option on redis://, `protocol=9`): a connection
    object is made here and dropped, which opens nothing."""
    pool = client.connection_pool
    try:
        pool.connection_class(**pool.connection_kwargs)
    except (TypeError, ValueError, redis.RedisError) as exc:
        why = str(exc).partition("__init__() ")[2] or str(exc)
        hidden = [str(v) for k, v in pool.connection_kwargs.items() if v and _SECRET_KEY.search(k)]
        if any(secret in why for secret in hidden):
            why = f"{type(exc).__name__}; the details are not shown as they quote a password"
        raise ConfigError(f"invalid Redis URL {mask_url(url)}: {why}") from None


def new_client_id() -> str:
    """A client's id in Redis (the owner of its leases): pid and 12 random hex digits."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def loop_client(url: str, timeout: float = defaults.LOOP_REDIS_TIMEOUT) -> redis.Redis:
    """A client for calls made by the scheduling loop and its threads: it connects lazily,
    every call gives up after `timeout` seconds, and redis-py does not retry on its own (the
    caller backs off and decides whether a command may be sent again). On a cluster URL: a
    ClusterClient (store/cluster.py) that routes each call by its key, with the same bounds."""
    if is_cluster_url(url):
        from .cluster import loop_cluster_client

        return loop_cluster_client(url, timeout)  # type: ignore[return-value]
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return from_url(
        redis.Redis,
        url,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        socket_keepalive=True,
        retry=Retry(NoBackoff(), 0),
    )


def reroute(r: Any) -> None:
    """Read the slot map again when `r` is a cluster client (nothing on one server): before
    the loop's reconcile, so a primary failed over while it was silent is not asked again
    (redis-py reads the map again only after a second timeout of its own, a pipeline's
    command sent again alone: 4 s lost per call with LOOP_REDIS_TIMEOUT 2 s).
    redis.ConnectionError when no node answers."""
    if hasattr(r, "nodes_manager"):  # a RedisCluster (redis.cluster is not imported here)
        from .cluster import refresh

        refresh(r)
