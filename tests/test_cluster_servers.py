"""The local cluster fixture itself (tests/cluster_servers.py): a node whose port another
process took between choosing and binding is started again elsewhere, and a start that fails
leaves no node running (a leaked node's Popen failed a later test under filterwarnings=error)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests import cluster_servers
from tests.cluster_servers import LocalCluster


def _taken() -> socket.socket:
    """A port bound by this process and not listening: a node's bind fails there
    (EADDRINUSE) and a PING is refused, as when another process takes the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture
def taken() -> Iterator[socket.socket]:
    sock = _taken()
    yield sock
    sock.close()


def test_a_node_whose_port_was_taken_starts_on_another(
    monkeypatch: pytest.MonkeyPatch, taken: socket.socket
) -> None:
    port = taken.getsockname()[1]
    real = cluster_servers._free_port_pair
    chosen = iter([port])
    monkeypatch.setattr(cluster_servers, "_free_port_pair", lambda: next(chosen, None) or real())
    cluster = LocalCluster(primaries=1).start(timeout=30)
    try:
        assert cluster.respawns == 1
        assert port not in cluster.ports
        view = cluster.node(cluster.ports[0])
        assert view.set("k", "v") and view.get("k") == b"v"
        view.close()
    finally:
        cluster.stop()


def test_a_failed_start_leaves_no_node_running(
    monkeypatch: pytest.MonkeyPatch, taken: socket.socket
) -> None:
    port = taken.getsockname()[1]
    monkeypatch.setattr(cluster_servers, "_free_port_pair", lambda: port)
    cluster = LocalCluster(primaries=1)
    with pytest.raises(RuntimeError, match="exited at start"):
        cluster.start(timeout=30)
    assert cluster.procs and all(proc.returncode is not None for proc in cluster.procs)
    assert not cluster.dir.exists()
