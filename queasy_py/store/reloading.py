"""The producer's redis.Redis on one server: a library call that finds the library gone is
sent again once the library is loaded (store/cluster.ClusterClient's reload, for one server).

A server can lose the function library under a running producer (an external Redis
restarted without persistence, FUNCTION FLUSH): every FCALL then answers "Function not
found", and nothing ran, so sending the call again is safe, a write's too. A library call
with keys (FCALL, FCALL_RO) refused so loads the library with the version handshake made at
connect (store/library.py: VersionMismatch for a newer major or a foreign library named
'queasy', never replaced), logs one WARNING, and is sent again once. The handshake's own
keyless probes are left alone (their "not found" is an answer). The writes that are sent
once (store/calls.FastCall) reload through load_library too.

A library call refused because its queue's keys of library 4.x are being converted into 5.0's
('TRYAGAIN upgrading': nothing ran but a step of that) calls queasy_upgrade until the queue is
converted, then is sent again (a read cannot convert: FCALL_RO).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import redis

from .library import ensure_loaded, library_key, library_reloaded
from .reload import sent_again_if_gone
from .upgrading import sent_again_if_upgrading, upgrade_call

log = logging.getLogger("queasy_py")


class ReloadingRedis(redis.Redis):
    """redis.Redis whose library calls survive a library lost by the server (module doc)."""

    #: the server, as the WARNING names it ("Redis at <masked URL>": producer_client sets it)
    where = "Redis"

    def execute_command(self, *args: Any, **options: Any) -> Any:
        send = functools.partial(super().execute_command, *args, **options)
        key = library_key(args)
        if key is None:
            return send()
        return sent_again_if_upgrading(
            lambda: sent_again_if_gone(send, lambda: self.load_library(gone=True)),
            functools.partial(super().execute_command, *upgrade_call(key)),
        )

    def load_library(self, key: str | None = None, gone: bool = False) -> str:
        """The version handshake (store/library.py), which loads the library when it is
        missing or older; its version. `gone`: a call found it gone (the WARNING). `key` is
        ClusterClient.load_library's (the primary to load it on): one server has one."""
        version = ensure_loaded(self)
        if gone:
            log.warning(library_reloaded(self.where, version))
        return version
