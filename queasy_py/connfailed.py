"""The public API's calls that reach Redis: when it cannot be reached, ConnectionFailed.

A client connects on its first call (Client.ready: ConnectionFailed naming the URL). Once it
has, redis-py's pool opens connections again by itself, and a server that went away (stopped,
killed, restarting, frozen) surfaced as redis-py's own ConnectionError or TimeoutError from
whichever call met it (on a Redis Cluster also as its RedisClusterException: no node
answers, or none serves the call's slot, and as its ClusterDownError: a node's CLUSTERDOWN
that outlasted the producer's wait). `@as_connection_failed` on each public method that
talks to Redis (Client, Queue, AsyncClient, AsyncQueue) raises ConnectionFailed instead,
naming the masked URL and the call, redis-py's error as its __cause__; the next call tries
again. A write whose reply was lost after it was sent (store/calls.py, store/aiocalls.py:
never sent again) is ConnectionFailed saying the server may have applied it, named the same
way. A QueasyError passes as it is (AuthenticationFailed, ClientClosed, InvalidInput), but
for one made here by a public call this one made (result()'s get_job): it is named again as
this call's. The supervisor's loop does not use it: it has its own outage handling
(runtime/outage.py). Its cost is one Python call more per call: 0.4-0.6 us on a dispatch
(measured against the same method unwrapped), under 1% of its round trip.

redis-py is not imported here: an error of its classes means it was (sys.modules).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import AuthenticationFailed, ConnectionFailed, QueasyError
from .store.connection import mask_url

F = TypeVar("F", bound=Callable[..., Any])


#: redis-py's RedisClusterException (not a RedisError) when no node answers, or the slot
#: map it read again lacks slots: "Redis Cluster cannot be connected. Please provide at
#: least one reachable node: ...", "All slots are not covered after query all
#: startup_nodes. ..."; its SlotNotCoveredError for a slot that no node of its map serves
_CLUSTER_UNREACHABLE = ("cannot be connected", "not covered", "no targets were found")


def unreachable(exc: BaseException) -> bool:
    """Whether redis-py's `exc` says Redis could not be reached: a connection error, a
    timeout, or on a cluster no node that answers, or none for the call's slot (redis-py's
    RedisClusterException: not a ConnectionError; a node's CLUSTERDOWN, its slot unserved
    still after the producer's wait, defaults.SLOT_WAIT). Another reply of the
    server (a moving slot, OOM) is not: the call was refused."""
    redis = sys.modules.get("redis")
    if redis is None:
        return False
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | OSError):
        return True
    if isinstance(exc, redis.exceptions.ClusterDownError):
        return True
    cluster_error = redis.exceptions.RedisClusterException
    if isinstance(exc, redis.exceptions.SlotNotCoveredError):
        return True
    return type(exc) is cluster_error and any(
        words in str(exc).lower() for words in _CLUSTER_UNREACHABLE
    )


def raise_connection_failed(exc: Exception, owner: Any, call: str) -> None:
    """Raise ConnectionFailed (AuthenticationFailed for refused credentials) from `exc`, met
    by `call` of `owner` (a client, or a queue of one), when `exc` says Redis could not be
    reached; else return (the caller raises `exc` as it is)."""
    if getattr(exc, "_as_connection_failed", False):  # of a call this one made (get_job)
        exc = getattr(exc, "_lost", exc.__cause__)  # named again as this call's
    if getattr(exc, "_reply_lost", False):  # a write sent once, its reply lost (calls.py)
        raise _named(f"{_what(owner, call)}: Redis at {_url(owner)}: {exc}", exc) from exc.__cause__
    if isinstance(exc, QueasyError) or not unreachable(exc):
        return
    redis = sys.modules["redis"]
    what, url = _what(owner, call), _url(owner)
    if isinstance(exc, redis.AuthenticationError):  # a ConnectionError of redis-py's
        failed: ConnectionFailed = AuthenticationFailed(
            f"{what}: Redis at {url} refused the credentials: {exc}"
        )
    elif isinstance(exc, redis.exceptions.ClusterDownError):
        failed = ConnectionFailed(
            f"{what}: Redis Cluster at {url} does not serve the call's slot, still after "
            f"waiting for it (ClusterDownError: {exc})"
        )
    else:
        why = f"{type(exc).__name__}: {exc}"
        failed = ConnectionFailed(f"{what}: cannot reach Redis at {url} ({why})")
    failed._as_connection_failed = True  # type: ignore[attr-defined]
    raise failed from exc


def _what(owner: Any, call: str) -> str:
    name = getattr(owner, "name", None)
    return f"{call}() of queue {name!r}" if isinstance(name, str) else f"{call}()"


def _url(owner: Any) -> str:
    return mask_url(getattr(owner, "client", owner).url)


def _named(text: str, lost: Exception) -> ConnectionFailed:
    """The ConnectionFailed of a public call whose write's reply was lost (`lost`: the
    store's, kept to be named again); raised from redis-py's error."""
    failed = ConnectionFailed(text)
    failed._as_connection_failed = True  # type: ignore[attr-defined]
    failed._lost = lost  # type: ignore[attr-defined]
    return failed


def as_connection_failed(method: F) -> F:
    """Decorate a public method that talks to Redis (a plain method, a coroutine, a
    generator or an async generator): redis-py's connection errors out of it are raised as
    ConnectionFailed (raise_connection_failed)."""
    call = method.__name__
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def coroutine(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return await method(self, *args, **kwargs)
            except Exception as exc:
                raise_connection_failed(exc, self, call)
                raise

        return coroutine  # type: ignore[return-value]
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def async_generator(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                async for item in method(self, *args, **kwargs):
                    yield item
            except Exception as exc:
                raise_connection_failed(exc, self, call)
                raise

        return async_generator  # type: ignore[return-value]
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def generator(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return (yield from method(self, *args, **kwargs))
            except Exception as exc:
                raise_connection_failed(exc, self, call)
                raise

        return generator  # type: ignore[return-value]

    @functools.wraps(method)
    def plain(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            raise_connection_failed(exc, self, call)
            raise

    return plain  # type: ignore[return-value]
