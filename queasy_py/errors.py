"""Every exception queasy_py raises, and the ones handlers raise to steer retries."""

from __future__ import annotations


class QueasyError(Exception):
    """Base class of every queasy_py error."""


class InvalidInput(QueasyError, ValueError):
    """An argument was rejected before anything was written."""


class ConfigError(QueasyError, ValueError):
    """A configuration file or option is malformed; the message names the key."""


class ConnectionFailed(QueasyError):
    """The Redis server could not be reached (the URL is named, its password masked)."""


class ClientClosed(ConnectionFailed):
    """The client was closed (close()) while a call of it waited: result() in another
    thread or task ends with this, not with the error of its connection closed under it."""


class AuthenticationFailed(ConnectionFailed):
    """The Redis server refused the credentials of the URL."""


class VersionMismatch(QueasyError):
    """The server holds a queasy function library of a newer major version."""


class HandlerError(QueasyError):
    """A handler module path does not import, or its module has no callable `handle`."""


class JobNotFound(QueasyError, LookupError):
    """No job with that id is waiting, running, or kept as ended (see keep_finished)."""


class JobFailed(QueasyError):
    """Queue.result(): the job failed for good (or was cancelled). `job` is its JobInfo,
    `error` its error: {"name", "kind", "message", "traceback", "at"}."""

    def __init__(self, message: str, job: object = None, error: dict | None = None) -> None:
        super().__init__(message)
        self.job = job
        self.error = error or {}


class ResultTimeout(QueasyError, TimeoutError):
    """Queue.result(): the job had not ended when the timeout passed."""


class PermanentError(QueasyError):
    """Raised by a handler to fail its job at once: no retries, straight to the fail handler."""

    kind = "permanent"


class RetryLater(QueasyError):
    """Raised by a handler to retry its job at `retry_at` (aware datetime or epoch seconds)."""

    def __init__(self, message: str = "", retry_at: object = None) -> None:
        super().__init__(message)
        self.retry_at = retry_at
