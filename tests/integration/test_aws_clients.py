"""The runtime's AWS clients (:mod:`stepagent.aws.clients`): botocore's clients behind coroutines.

Checked against real servers (loopback HTTPS with a CA made here, and the moto server): calls from
concurrent coroutines are in flight together; a streamed body reads through ``async with``; leaving the
context closes the client; every client of the process trusts the CA bundle through one context loaded
once (botocore's own loads it again for every connection), still verifying — a server whose certificate
that bundle does not vouch for is refused.
"""

from __future__ import annotations

import asyncio
import datetime
import http.server
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import SSLError
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from stepagent.aws import clients
from stepagent.aws.clients import AwsSession, open_client
from tests.conftest import REGION, aws_client, moto_endpoint, unique_name


def _self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by itself (so it is its own CA bundle), and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


class _JsonApi(http.server.BaseHTTPRequestHandler):
    """Answers every AWS JSON-protocol call with ``{}`` after ``delay`` seconds, noting peak concurrency."""

    protocol_version = "HTTP/1.1"
    delay = 0.0
    lock = threading.Lock()
    in_flight = 0
    peak = 0
    connections: set[tuple[str, int]] = set()

    def do_POST(self) -> None:
        cls = type(self)
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with cls.lock:
            cls.in_flight += 1
            cls.peak = max(cls.peak, cls.in_flight)
            cls.connections.add(self.client_address)
        threading.Event().wait(cls.delay)
        with cls.lock:
            cls.in_flight -= 1
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A loopback HTTPS JSON API and the CA bundle (its own certificate) that vouches for it."""
    cert, key = _self_signed(tmp_path, "server")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _JsonApi)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    _JsonApi.delay, _JsonApi.in_flight, _JsonApi.peak = 0.0, 0, 0
    _JsonApi.connections = set()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def bundle_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every CA file loaded into any TLS context from now on."""
    loads: list[str] = []
    original = ssl.SSLContext.load_verify_locations

    def noting(self: ssl.SSLContext, cafile: Any = None, *args: Any, **kwargs: Any) -> None:
        loads.append(str(cafile))
        original(self, cafile, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", noting)
    clients._shared_tls.cache_clear()
    return loads


async def test_all_clients_trust_the_bundle_through_one_context_loaded_once(
    tls_server: tuple[str, Path], bundle_loads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, bundle = tls_server
    monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
    session = AwsSession(REGION)
    async with open_client(session, "sqs", url) as sqs, open_client(session, "dynamodb", url) as dynamodb:
        _JsonApi.delay = 0.2  # concurrent calls need a connection each
        await asyncio.gather(*(dynamodb.list_tables() for _ in range(3)), sqs.list_queues())
    assert len(_JsonApi.connections) >= 3  # several TLS connections, over two clients...
    assert bundle_loads == [str(bundle)]  # ...one parse of the bundle


async def test_a_server_the_bundle_does_not_vouch_for_is_refused(
    tls_server: tuple[str, Path], bundle_loads: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url, _ = tls_server
    other, _ = _self_signed(tmp_path, "other")
    monkeypatch.setenv("AWS_CA_BUNDLE", str(other))
    async with open_client(AwsSession(REGION), "dynamodb", url) as dynamodb:
        with pytest.raises(SSLError):
            await dynamodb.list_tables()
    assert bundle_loads == [str(other)]


async def test_calls_from_concurrent_coroutines_are_in_flight_together(
    tls_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, bundle = tls_server
    monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
    async with open_client(AwsSession(REGION), "dynamodb", url) as dynamodb:
        _JsonApi.delay = 0.3
        await asyncio.gather(*(dynamodb.list_tables() for _ in range(4)))
    assert _JsonApi.peak == 4


async def test_a_streamed_body_reads_in_an_async_context_and_the_client_closes() -> None:
    bucket, data = unique_name("clients"), b"x" * 300_000
    async with aws_client("s3") as s3:
        await s3.create_bucket(Bucket=bucket)
        await s3.put_object(Bucket=bucket, Key="k", Body=data)
        response = await s3.get_object(Bucket=bucket, Key="k")
        async with response["Body"] as stream:
            assert await stream.read() == data
        assert s3.meta.service_model.service_name == "s3"
        pool = s3._client._endpoint.http_session._manager
        assert pool.pools  # a connection pool is open...
    assert not pool.pools  # ...and leaving the context closed it


async def test_a_plain_http_endpoint_loads_no_ca_bundle(bundle_loads: list[str]) -> None:
    async with open_client(AwsSession(REGION), "dynamodb", moto_endpoint()) as dynamodb:
        await dynamodb.list_tables()
    assert bundle_loads == []
