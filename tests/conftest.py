"""Shared fixtures.

AWS: every test talks to one moto server (``ThreadedMotoServer`` on 127.0.0.1, a free port), started
lazily the first time a test needs it and stopped at the end of the session. The runtime's clients
(aioboto3, over aiohttp) do not work under in-process ``mock_aws``, so they always get the server's
``endpoint_url``. Fake credentials are forced
into the environment when this module is imported, before any client exists, so a test can never reach
real AWS with a developer's credentials. Each test gets uniquely named tables, so tests share no state.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest

from stepagent.aws.resources import ensure_tables
from stepagent.stores.dynamodb import DynamoConversationStore, DynamoStateStore, dynamo_stores
from stepagent.stores.metrics import StoreMetrics

REGION = "us-east-1"

# Fake credentials, set at import so no client created during the session ever sees real ones; profile
# and shared-file lookups are disabled for the same reason.
for _name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
    os.environ.pop(_name, None)
os.environ.update(
    AWS_ACCESS_KEY_ID="testing",
    AWS_SECRET_ACCESS_KEY="testing",
    AWS_DEFAULT_REGION=REGION,
    AWS_REGION=REGION,
    AWS_CONFIG_FILE=os.devnull,
    AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    AWS_EC2_METADATA_DISABLED="true",
)
logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log is noise in test output

# moto and the AWS clients are imported on first use, so test runs that never touch AWS do not pay for them.
_server: Any = None  # moto.server.ThreadedMotoServer once started
_server_url: str | None = None
_server_lock = threading.Lock()
_bucket: str | None = None


@cache
def aws_session() -> Any:
    """One session for the whole run (the runtime's own client factory): it caches the loaded service models.
    Clients are opened per test: each belongs to its test's event loop."""
    from stepagent.aws.clients import AwsSession

    return AwsSession(REGION)


class _UndoLogTransactions:
    """Makes moto's ``TransactWriteItems`` roll back with an undo log instead of table copies.

    moto backs a transaction up by deep-copying the whole table once per *action* and, on cancellation,
    puts the copy back: a 100-action commit copies a 3,000-item table 100 times (a step's commit gets
    slower with every item any test ever wrote to the table), and a cancelled transaction undoes writes
    that other requests made meanwhile. Installed here, each transaction instead remembers the items it
    is about to touch (a copy of each, or their absence) and, if moto raises, puts exactly those back:
    the same all-or-nothing outcome as DynamoDB, in time proportional to the transaction. moto's own
    table copy is skipped (its rollback then reassigns the same table, a no-op)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    def deepcopy(self, value: Any, memo: Any = None) -> Any:
        from moto.dynamodb.models.table import Table

        if getattr(self._local, "active", False) and memo is None and isinstance(value, Table):
            return value  # moto's whole-table backup: the undo log below replaces it
        return copy.deepcopy(value, memo)

    def install(self) -> None:
        from moto.dynamodb import models

        backend = models.DynamoDBBackend
        original = backend.transact_write_items
        local = self._local

        def transact_write_items(self_: Any, transact_items: list[dict[str, Any]]) -> Any:
            undo: list[tuple[Any, Any, Any, Any]] = []
            for action in transact_items:
                _, op = next(iter(action.items()))
                table = self_.tables.get(op.get("TableName"))
                if table is None:
                    continue
                item = op.get("Item", {})
                names = [n for n in (table.hash_key_attr, table.range_key_attr) if n and n in item]
                keys = op.get("Key") or {n: item[n] for n in names}
                try:
                    hash_key, range_key = self_.get_keys_value(table, keys)
                except Exception:  # a malformed key: moto itself raises the proper error below
                    continue
                undo.append((table, hash_key, range_key, copy.deepcopy(table.get_item(hash_key, range_key))))
            local.active = True
            try:
                return original(self_, transact_items)
            except BaseException:
                for table, hash_key, range_key, before in reversed(undo):
                    if before is None:
                        table.delete_item(hash_key, range_key)
                    elif range_key is not None:
                        table.items[hash_key][range_key] = before
                    else:
                        table.items[hash_key] = before
                raise
            finally:
                local.active = False

        models.copy = self  # type: ignore[assignment]
        backend.transact_write_items = transact_write_items  # type: ignore[method-assign]


def _fast_sqs_clock() -> None:
    """Two per-request costs of moto that grow with what a test has stored or are pure overhead.

    moto's SQS asks for the current time once per stored message on every send and receive (to
    compute visibility and the approximate counts), through a datetime round trip; with thousands of
    messages on a queue that dominates every test. The same value, from ``time.time()``."""
    import time

    from moto.sqs import models

    slow_time, slow_millis = models.unix_time, models.unix_time_millis

    def unix_time(dt: Any = None) -> float:
        return time.time() if dt is None else float(slow_time(dt))

    def unix_time_millis(dt: Any = None) -> float:
        return time.time() * 1000.0 if dt is None else float(slow_millis(dt))

    models.unix_time, models.unix_time_millis = unix_time, unix_time_millis

    # And the server lists its own package directory (a listdir plus ~200 isdir calls) on every request.
    from moto import backends

    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules  # type: ignore[assignment]


def moto_endpoint() -> str:
    """The shared moto server's URL, starting the server on first use."""
    global _server, _server_url
    with _server_lock:
        if _server_url is None:
            from moto.server import ThreadedMotoServer

            _UndoLogTransactions().install()
            _fast_sqs_clock()
            _serialize_moto_dynamodb()
            server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            server.start()
            host, port = server.get_host_and_port()
            _server, _server_url = server, f"http://{host}:{port}"
        return _server_url


def _serialize_moto_dynamodb() -> None:
    """Make moto's DynamoDB answer one request at a time, as isolated as DynamoDB's own.

    moto applies a TransactWriteItems by deep-copying every table (for rollback) while other request
    threads keep reading and writing them, so concurrent steps (one asyncio task per thread of a batch)
    fail inside moto with "dictionary changed size during iteration". Real DynamoDB isolates these; one lock
    over the backend's public methods gives moto the same behaviour (and changes nothing else).
    """
    import functools

    from moto.dynamodb.models import DynamoDBBackend

    if getattr(DynamoDBBackend, "_stepagent_serialized", False):
        return
    lock = threading.RLock()
    for name, method in list(vars(DynamoDBBackend).items()):
        if name.startswith("_") or not callable(method):
            continue

        def locked(*args: Any, __method: Any = method, **kwargs: Any) -> Any:
            with lock:
                return __method(*args, **kwargs)

        setattr(DynamoDBBackend, name, functools.wraps(method)(locked))
    DynamoDBBackend._stepagent_serialized = True  # type: ignore[attr-defined]


@pytest.fixture(scope="session", autouse=True)
def _stop_moto_server() -> Iterator[None]:
    yield
    if _server is not None:
        _server.stop()


@pytest.fixture(scope="session")
def moto_url() -> str:
    return moto_endpoint()


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@asynccontextmanager
async def aws_client(service: str) -> AsyncIterator[Any]:
    """The runtime's low-level client for ``service`` (:mod:`stepagent.aws.clients`) on the moto server."""
    from stepagent.aws.clients import open_client

    async with open_client(aws_session(), service, moto_endpoint()) as client:
        yield client


async def shared_bucket(s3: Any) -> str:
    """One blob bucket for the session. Sharing is safe: blob keys embed the thread, order, version and
    content hash, so equal keys mean equal content."""
    global _bucket
    if _bucket is None:
        name = unique_name("stepagent-blobs")
        await s3.create_bucket(Bucket=name)
        _bucket = name
    return _bucket


@dataclass
class DynamoEnv:
    """Everything a DynamoDB store test needs: clients on moto, fresh tables, the blob bucket, metrics."""

    client: Any
    s3: Any
    conversation_table: str
    state_table: str
    bucket: str
    metrics: StoreMetrics = field(default_factory=StoreMetrics)

    def stores(
        self,
        *,
        client: Any = None,
        with_blobs: bool = True,
        metrics: StoreMetrics | None = None,
        page_size: int | None = 100,
    ) -> tuple[DynamoConversationStore, DynamoStateStore]:
        """A store pair over this env's tables (another instance each call, like another Lambda)."""
        return dynamo_stores(
            client if client is not None else self.client,
            conversation_table=self.conversation_table,
            state_table=self.state_table,
            s3_client=self.s3 if with_blobs else None,
            bucket=self.bucket if with_blobs else None,
            metrics=metrics if metrics is not None else self.metrics,
            page_size=page_size,
        )


@asynccontextmanager
async def dynamo_env() -> AsyncIterator[DynamoEnv]:
    """Fresh, uniquely named tables on the moto server; deleted afterwards to keep the server small."""
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(aws_client("dynamodb"))
        s3 = await stack.enter_async_context(aws_client("s3"))
        conversation_table, state_table = unique_name("conversation"), unique_name("state")
        await ensure_tables(client, conversation_table, state_table)
        try:
            yield DynamoEnv(client, s3, conversation_table, state_table, await shared_bucket(s3))
        finally:
            for table in (conversation_table, state_table):
                await client.delete_table(TableName=table)


@asynccontextmanager
async def dynamo_store_pair() -> AsyncIterator[tuple[DynamoConversationStore, DynamoStateStore]]:
    """A fresh, empty DynamoDB store pair (the contract suite's factory)."""
    async with dynamo_env() as env:
        yield env.stores()


@pytest.fixture
async def dynamo() -> AsyncIterator[DynamoEnv]:
    async with dynamo_env() as env:
        yield env
