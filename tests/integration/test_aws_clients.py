"""The runtime's AWS clients (:mod:`stepagent.aws.clients`): aioboto3's, on the caller's event loop.

Checked against real servers (loopback HTTP(S) with a CA made here, and the moto server): calls from
concurrent coroutines are in flight together; cancelling a caller aborts its request (the server sees
the connection dropped); botocore's hooks run in the caller's context (context variables such as log
keys are seen); a streamed body reads through ``async with``; paginators are async; leaving the context
closes the client's connections; a client parses the CA bundle once for all its connections (aiobotocore
does so at its first request, even over plain HTTP), still verifying — a server whose certificate that
bundle does not vouch for is refused; a lazy client opens once under concurrent first calls. The worker's
runtime keeps the Bedrock model's client across steps (one connection) and closes it when it closes.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import gc
import http.server
import ipaddress
import select
import ssl
import threading
import warnings
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import SSLError
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bench.cold_start import BEDROCK_ANSWER
from stepagent.aws.clients import AwsSession, LazyClient, open_client
from tests.conftest import REGION, aws_client, moto_endpoint, unique_name
from tests.integration.aws_helpers import aws_stack
from tests.providers.bedrock_stub import serve


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
    """Answers every AWS JSON-protocol call with ``{}`` after ``delay`` seconds, noting peak concurrency
    and the connections the client closed. With ``hold`` set it answers nothing: it notes the request
    (``held``) and waits until the client drops the connection (``dropped``)."""

    protocol_version = "HTTP/1.1"
    delay = 0.0
    hold = False
    held = threading.Event()
    dropped = threading.Event()
    lock = threading.Lock()
    in_flight = 0
    peak = 0
    connections: set[tuple[str, int]] = set()
    closed: set[tuple[str, int]] = set()

    def do_POST(self) -> None:
        cls = type(self)
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with cls.lock:
            cls.in_flight += 1
            cls.peak = max(cls.peak, cls.in_flight)
            cls.connections.add(self.client_address)
        if cls.hold:
            cls.held.set()
            # Readable with nothing to read: the client closed its end (bounded, so a bug cannot hang).
            readable, _, _ = select.select([self.connection], [], [], 20)
            if readable and self.connection.recv(1) == b"":
                cls.dropped.set()
            self.close_connection = True
            return
        threading.Event().wait(cls.delay)
        with cls.lock:
            cls.in_flight -= 1
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def finish(self) -> None:
        super().finish()
        with type(self).lock:
            type(self).closed.add(self.client_address)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _reset_api() -> None:
    _JsonApi.delay, _JsonApi.hold, _JsonApi.in_flight, _JsonApi.peak = 0.0, False, 0, 0
    _JsonApi.held, _JsonApi.dropped = threading.Event(), threading.Event()
    _JsonApi.connections, _JsonApi.closed = set(), set()


@pytest.fixture
def http_server() -> Iterator[str]:
    """The same JSON API over plain HTTP on loopback."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _JsonApi)
    server.daemon_threads = True
    _reset_api()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A loopback HTTPS JSON API and the CA bundle (its own certificate) that vouches for it."""
    cert, key = _self_signed(tmp_path, "server")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _JsonApi)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    _reset_api()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
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
    return loads


async def _wait(event: threading.Event) -> bool:
    """Wait for a server thread's event without blocking the loop (bounded: a bug fails, never hangs)."""
    return await asyncio.get_running_loop().run_in_executor(None, event.wait, 20)


async def test_a_client_parses_the_ca_bundle_once_for_all_its_connections(
    tls_server: tuple[str, Path], bundle_loads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, bundle = tls_server
    monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
    session = AwsSession(REGION)
    async with open_client(session, "sqs", url) as sqs, open_client(session, "dynamodb", url) as dynamodb:
        _JsonApi.delay = 0.2  # concurrent calls need a connection each
        await asyncio.gather(*(dynamodb.list_tables() for _ in range(3)))
        await dynamodb.list_tables()
        await sqs.list_queues()
    assert len(_JsonApi.connections) >= 4  # several TLS connections over two clients...
    assert bundle_loads == [str(bundle)] * 2  # ...one parse of the bundle per client


async def test_a_server_the_bundle_does_not_vouch_for_is_refused(
    tls_server: tuple[str, Path], bundle_loads: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url, _ = tls_server
    other, _ = _self_signed(tmp_path, "other")
    monkeypatch.setenv("AWS_CA_BUNDLE", str(other))
    once = Config(retries={"max_attempts": 1, "mode": "standard"})
    async with open_client(AwsSession(REGION), "dynamodb", url, once) as dynamodb:
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


async def test_cancelling_a_caller_aborts_its_request(http_server: str) -> None:
    _JsonApi.hold = True
    async with open_client(AwsSession(REGION), "dynamodb", http_server) as dynamodb:
        call = asyncio.create_task(dynamodb.list_tables())
        assert await _wait(_JsonApi.held)  # the request is on the server, which will never answer
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # Dropped by the cancellation itself, while the client is still open (not by closing it).
        assert await _wait(_JsonApi.dropped)


async def test_hooks_run_in_the_callers_context(http_server: str) -> None:
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")
    seen: list[str] = []
    async with open_client(AwsSession(REGION), "dynamodb", http_server) as dynamodb:
        hook = "before-send.dynamodb.ListTables"
        dynamodb.meta.events.register(hook, lambda **_: seen.append(request_id.get()))
        request_id.set("r-1")
        await dynamodb.list_tables()
    assert seen == ["r-1"]


async def test_leaving_the_context_closes_the_clients_connections(http_server: str) -> None:
    async with open_client(AwsSession(REGION), "dynamodb", http_server) as dynamodb:
        await asyncio.gather(*(dynamodb.list_tables() for _ in range(2)))
        opened = set(_JsonApi.connections)
        assert opened and not opened & _JsonApi.closed  # kept alive for the next call
    closing = threading.Event()

    def all_closed() -> None:
        while not opened <= _JsonApi.closed:
            if closing.wait(0.01):
                return
        closing.set()

    await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, all_closed), 20)


async def test_a_streamed_body_reads_in_an_async_context_and_pages_are_async() -> None:
    bucket, data = unique_name("clients"), b"x" * 300_000
    async with aws_client("s3") as s3:
        await s3.create_bucket(Bucket=bucket)
        await s3.put_object(Bucket=bucket, Key="k", Body=data)
        for key in ("a", "b"):
            await s3.put_object(Bucket=bucket, Key=key, Body=b"")
        response = await s3.get_object(Bucket=bucket, Key="k")
        async with response["Body"] as stream:
            assert await stream.read() == data
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, PaginationConfig={"PageSize": 1})
        keys = [obj["Key"] async for page in pages for obj in page.get("Contents", [])]
    assert keys == ["a", "b", "k"]


async def test_a_lazy_client_opens_once_under_concurrent_first_calls() -> None:
    opened: list[Any] = []
    table = unique_name("lazy")
    async with AsyncExitStack() as stack:

        async def opener() -> Any:
            opening = open_client(AwsSession(REGION), "dynamodb", moto_endpoint())
            real = await stack.enter_async_context(opening)
            opened.append(real)
            return real

        lazy = LazyClient(opener)
        assert not lazy.opened
        found = await asyncio.gather(*(lazy.describe_limits() for _ in range(3)))
        assert len(opened) == 1 and lazy.opened and all("AccountMaxReadCapacityUnits" in f for f in found)
        assert await lazy.opened_client() is opened[0]
        with pytest.raises(AttributeError):
            lazy.get_paginator  # noqa: B018 - synchronous on the real client: never a coroutine here
        with pytest.raises(Exception, match=table):
            await lazy.describe_table(TableName=table)


async def test_the_runtime_keeps_the_model_client_across_steps_and_closes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gc.collect()  # earlier tests' garbage is not this test's
    with contextmanager(serve)() as bedrock:
        bedrock.events = BEDROCK_ANSWER
        monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", bedrock.url)
        model = {"STEPAGENT_MODEL": "bedrock:us.anthropic.claude-sonnet-4-5-20250929-v1:0"}
        async with aws_stack(env=model) as stack:
            for n in (1, 2):
                thread = unique_name("bedrock")
                await stack.send_user(thread, "hello", f"m{n}")
                await stack.pump()
                assert (await stack.texts(thread))[-1] == BEDROCK_ANSWER[1]["contentBlockDelta"]["delta"][
                    "text"
                ]
        assert len(bedrock.peers) == 2 and bedrock.peers[0] == bedrock.peers[1]  # one kept connection
    del stack
    # Leaving the stack closed the runtime, which closed the model's client: collecting it finds no
    # unclosed aiohttp session (aiohttp warns about one when it is collected).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert [str(w.message) for w in caught if "Unclosed" in str(w.message)] == []
