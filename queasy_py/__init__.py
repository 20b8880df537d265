"""queasy_py: a Redis-backed job runtime for Python."""

from .client import Client
from .errors import (
    ConfigError,
    ConnectionFailed,
    HandlerError,
    InvalidInput,
    PermanentError,
    QueasyError,
    RetryLater,
    VersionMismatch,
)
from .job import Job, JobInfo
from .queue import Queue

__all__ = [
    "Client",
    "ConfigError",
    "ConnectionFailed",
    "HandlerError",
    "InvalidInput",
    "Job",
    "JobInfo",
    "PermanentError",
    "QueasyError",
    "Queue",
    "RetryLater",
    "VersionMismatch",
]
__version__ = "0.1.0"
