"""Plumbing shared by the DynamoDB stores: attribute helpers, write actions, and :class:`DynamoIo`.

What it guarantees:

- Every AWS call goes through :meth:`DynamoIo.call` (or the S3 helper), which counts it in
  :class:`~stepagent.stores.metrics.StoreMetrics` and turns any botocore or connection failure into
  :class:`~stepagent.errors.StoreError` naming the operation and the table. Refused conditions surface as
  :class:`ConditionFailed` / :class:`TransactionCancelled` (with DynamoDB's per-action reasons) so callers
  can tell a lost race from an outage.
- Payloads over :data:`INLINE_LIMIT` bytes are never stored inline. A canonical JSON payload
  (:func:`stepagent.blobs.canonical`: rows, messages, anything our encoders wrote) keeps its skeleton in
  ``body`` and names its large strings in ``texts`` (``[{"path": [...], "key": "blobs/sha256/<hex>"}]``):
  content-addressed objects of :mod:`stepagent.blobs`, shared with the queue body and output event that
  repeat them, written only when not known to exist, read at most once while cached, verified on read
  (a mismatch is :class:`~stepagent.errors.CorruptRowError`), and never deleted by the stores. Any other
  big payload (not JSON, or too big even without its large strings) is one object under a deterministic
  ``{blob_key}-{sha256[:16]}`` key named by ``blob`` (a retry rewrites the same object; a read verifies
  the hash); only those per-item objects are deleted with their rows.
- Every item written through :func:`put`, :func:`update` and :meth:`DynamoIo.batch_put` carries this
  release's format version (:data:`~stepagent.formats.FORMAT_FIELD`), and :meth:`DynamoIo.read_payload`
  refuses an item of a newer format with :class:`~stepagent.errors.NewerFormatError` before decoding it.
- Batch calls respect AWS's limits (25 writes, 100 keys) even where moto does not, and retry unprocessed
  items with bounded backoff, failing loudly rather than dropping any.
- Every transaction goes through :meth:`DynamoIo.transact`, the one place a cancellation is tried again:
  only one the caller's predicate accepts (by default a ``TransactionConflict`` with no failed condition,
  which wrote nothing), at most :data:`CONFLICT_BACKOFF` attempts; the rest reach the caller to classify.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError

from stepagent.backoff import Backoff
from stepagent.blobs import (
    BlobCorrupt,
    BlobError,
    ContentBlobs,
    canonical,
    dumps,
    fill,
    is_digest,
    key_of,
    split,
)
from stepagent.errors import CorruptRowError, PayloadTooLargeError, StoreError
from stepagent.formats import FORMAT_FIELD, FORMAT_VERSION, item_version
from stepagent.stores.metrics import StoreMetrics

if TYPE_CHECKING:  # the types-aiobotocore stubs: a development dependency, never imported at run time
    from types_aiobotocore_dynamodb import DynamoDBClient
    from types_aiobotocore_dynamodb.type_defs import AttributeValueTypeDef
    from types_aiobotocore_s3 import S3Client

#: A DynamoDB item in the low-level wire form (attribute name → typed value, ``{"S": "..."}``), as the
#: client returns it and takes it: also a key, and an expression's values.
DynamoItem: TypeAlias = "dict[str, AttributeValueTypeDef]"
#: The keyword arguments of one low-level call (or an action of a transaction), and a response to one:
#: :meth:`DynamoIo.call` dispatches on the operation's name, so these stay untyped.
Request: TypeAlias = dict[str, Any]

#: Payloads (encoded rows, state JSON) larger than this many UTF-8 bytes go to S3 (items cap at 400 KB).
INLINE_LIMIT = 350_000
#: TransactWriteItems limits: 100 actions and 4 MB; the byte budget leaves room for our size estimate.
MAX_TRANSACT_ACTIONS = 100
TRANSACT_BYTE_BUDGET = 3_500_000
#: Processed/answered markers outlive SQS's longest retention (14 days), so a redelivery still dedups.
MARKER_TTL_S = 30 * 24 * 3600
#: The attributes a payload may occupy (:meth:`DynamoIo.payload`); an upsert removes those it does not set.
PAYLOAD_ATTRIBUTES = ("blob", "body", "texts")
_BATCH_GET_KEYS = 100
_BATCH_WRITE_ITEMS = 25  # moto does not enforce this limit; AWS does, so chunk ourselves
_NUMBER_SIZE = 11


def s_attr(value: str) -> AttributeValueTypeDef:
    """A DynamoDB string attribute value."""
    return {"S": value}


def n_attr(value: int) -> AttributeValueTypeDef:
    """A DynamoDB number attribute value."""
    return {"N": str(value)}


def item_key(pk: str, sk: str) -> DynamoItem:
    """The primary key of item (``pk``, ``sk``) in either table."""
    return {"pk": s_attr(pk), "sk": s_attr(sk)}


def stamped(item: DynamoItem) -> DynamoItem:
    """``item`` with this release's format version (a copy; an item that has one keeps it)."""
    if FORMAT_FIELD in item:
        return item
    return {**item, FORMAT_FIELD: n_attr(FORMAT_VERSION)}


def _stamp_expression(expression: str, names: dict[str, str], values: DynamoItem) -> str:
    """``expression`` that also sets the format version (inside its SET clause, or a new one first); one
    built from an expression that sets it already is left as it is."""
    if "#fmtv" in names:
        return expression
    names["#fmtv"] = FORMAT_FIELD
    values[":fmtv"] = n_attr(FORMAT_VERSION)
    if expression.startswith("SET "):
        return f"SET #fmtv = :fmtv, {expression[4:]}"
    if " SET " in expression:
        return expression.replace(" SET ", " SET #fmtv = :fmtv, ", 1)
    return f"SET #fmtv = :fmtv {expression}"


def chunks(seq: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """``seq`` in consecutive slices of at most ``size`` items."""
    for start in range(0, len(seq), size):
        yield seq[start : start + size]


def _value_size(value: Mapping[str, Any]) -> int:
    # DynamoDB's item-size rules, for budgeting and metrics: a string counts its UTF-8 bytes. A number
    # counts 11 bytes, the upper bound for our integers (< 10**19: one byte per two digits, plus one), so
    # sizes do not creep with counters such as the tail: same commit shape, same size.
    if "S" in value:
        return len(str(value["S"]).encode())
    if "N" in value:
        return _NUMBER_SIZE
    if "SS" in value:
        return sum(len(str(v).encode()) for v in value["SS"])
    return 1


def item_size(item: Mapping[str, Any]) -> int:
    """An item's size as DynamoDB counts it against the 400 KB item and 4 MB transaction limits."""
    return sum(len(name.encode()) + _value_size(value) for name, value in item.items())


@dataclass(frozen=True, slots=True)
class Write:
    """One write, usable both as a TransactWriteItems action and as a standalone PutItem/UpdateItem call."""

    kind: Literal["Put", "Update", "Delete", "ConditionCheck"]
    request: Request
    size: int
    is_row: bool = False

    def action(self) -> Request:
        return {self.kind: self.request}


def put(
    table: str,
    item: DynamoItem,
    condition: str | None = None,
    names: dict[str, str] | None = None,
    values: DynamoItem | None = None,
    *,
    is_row: bool = False,
) -> Write:
    """A Put of ``item``, optionally conditioned; ``is_row`` marks a history row (its conflicts are debris)."""
    item = stamped(item)
    request: Request = {"TableName": table, "Item": item}
    if condition is not None:
        request["ConditionExpression"] = condition
    if names:
        request["ExpressionAttributeNames"] = names
    if values:
        request["ExpressionAttributeValues"] = values
    return Write("Put", request, item_size(item), is_row=is_row)


def delete(table: str, key: DynamoItem) -> Write:
    """An unconditional Delete of the item at ``key``."""
    return Write("Delete", {"TableName": table, "Key": key}, item_size(key))


def update(
    table: str, key: DynamoItem, expression: str, names: dict[str, str], values: DynamoItem, **extra: Any
) -> Write:
    """An Update of the item at ``key`` (``extra`` carries e.g. a ``ConditionExpression``); it also sets
    the item's format version."""
    names, values = dict(names), dict(values)
    expression = _stamp_expression(expression, names, values)
    request: Request = {
        "TableName": table,
        "Key": key,
        "UpdateExpression": expression,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
        **extra,
    }
    # Approximate written size: the key plus every name and value the expression mentions.
    size = item_size(key) + sum(len(n) for n in names.values()) + sum(_value_size(v) for v in values.values())
    return Write("Update", request, size)


class ConditionFailed(Exception):
    """A single-item conditional write was refused."""


#: A transaction DynamoDB cancelled for a conflict with another one (``TransactionConflict``: nothing was
#: written) is tried again at once-ish, three times in all, spread apart by jitter.
CONFLICT_BACKOFF = Backoff(attempts=3, base=0.02, cap=0.5)


#: ``UnprocessedKeys``/``UnprocessedItems`` (DynamoDB throttled part of a batch) are sent again after a
#: jittered, doubling wait from 50 ms up to 1 s, eight requests in all.
BATCH_BACKOFF = Backoff(attempts=8, base=0.05, cap=1.0)


class TransactionCancelled(Exception):
    """A cancelled ``TransactWriteItems``, with DynamoDB's cancellation reason per action, in order."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__(", ".join(reasons))
        self.reasons = reasons


def conflicted(reasons: Sequence[str]) -> bool:
    """Whether a cancelled transaction may simply run again: another transaction conflicted with it and
    none of its conditions failed (so nothing was written and nothing the caller checked has changed)."""
    return "TransactionConflict" in reasons and "ConditionalCheckFailed" not in reasons


_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


class DynamoIo:
    """AWS calls with metrics, error mapping and the S3 claim check, shared by both stores."""

    def __init__(
        self,
        client: DynamoDBClient,
        s3_client: S3Client | None,
        bucket: str | None,
        metrics: StoreMetrics,
        blobs: ContentBlobs | None = None,
    ):
        if bucket is not None and s3_client is None:
            raise ValueError(f"blob bucket {bucket!r} given without an S3 client")
        self.client = client
        # An S3 client without a bucket (STEPAGENT_BLOB_BUCKET unset) means no blobs: large payloads are
        # rejected with a clear PayloadTooLargeError, and reads of blob items fail loudly.
        self.s3 = s3_client if bucket is not None else None
        self.bucket = bucket
        self.metrics = metrics
        if blobs is None and self.s3 is not None and bucket is not None:
            blobs = ContentBlobs(self.s3, bucket, metrics)
        self.blobs = blobs if self.s3 is not None else None

    async def call(self, op: str, table: str, **kwargs: Any) -> Request:
        self.metrics.count_call(op)
        try:
            response: Request = await getattr(self.client, _SNAKE.sub("_", op).lower())(**kwargs)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            if code == "ConditionalCheckFailedException":
                raise ConditionFailed from None
            if code == "TransactionCanceledException":
                reasons = [str(r.get("Code", "None")) for r in exc.response.get("CancellationReasons", [])]
                raise TransactionCancelled(reasons) from None
            raise StoreError(
                f"DynamoDB {op} on table {table} failed: {code}: {error.get('Message', exc)}"
            ) from exc
        except (BotoCoreError, OSError, TimeoutError) as exc:
            raise StoreError(f"DynamoDB {op} on table {table} failed: {type(exc).__name__}: {exc}") from exc
        self._count_read(response)
        return response

    def _count_read(self, response: Request) -> None:
        """Items (and their estimated size) a read returned: ``Item``, ``Items`` or ``Responses``."""
        items: list[DynamoItem] = []
        if response.get("Item"):
            items.append(response["Item"])
        items.extend(response.get("Items", ()))
        for found in (response.get("Responses") or {}).values():
            if isinstance(found, list):
                items.extend(found)
        if items:
            self.metrics.items_read += len(items)
            self.metrics.bytes_read += sum(item_size(item) for item in items)

    def count_written(self, writes: Sequence[Write]) -> None:
        for write in writes:
            if write.kind != "ConditionCheck":
                self.metrics.items_written += 1
                self.metrics.bytes_written += write.size

    async def payload(self, text: str, blob_key: str) -> DynamoItem:
        """``{"body": text}``; for a payload over :data:`INLINE_LIMIT` the skeleton in ``body`` and its
        shared texts in ``texts``, else (see the module docstring) ``{"blob": key}`` after putting it to S3
        under ``{blob_key}-{sha256[:16]}``."""
        data = text.encode()
        if len(data) <= INLINE_LIMIT:
            return {"body": s_attr(text)}
        if self.blobs is None:
            raise PayloadTooLargeError(
                f"{blob_key}: {len(data)} bytes exceeds the {INLINE_LIMIT}-byte DynamoDB item budget and no "
                "blob bucket is configured (set STEPAGENT_BLOB_BUCKET)"
            )
        shared = await self._shared_texts(text)
        if shared is not None:
            return shared
        key = f"{blob_key}-{hashlib.sha256(data).hexdigest()[:16]}"
        await self._s3("PutObject", key, Body=data)
        self.metrics.bytes_written += len(data)
        return {"blob": s_attr(key)}

    async def _shared_texts(self, text: str) -> DynamoItem | None:
        """The ``body`` + ``texts`` attributes of a JSON payload whose skeleton fits inline, after storing
        its texts; ``None`` for any other payload."""
        assert self.blobs is not None
        parsed, doc = canonical(text)
        if not parsed:
            return None
        skeleton, holes = split(doc)
        body = dumps(skeleton)
        if not holes or len(body.encode()) > INLINE_LIMIT:
            return None
        refs = []
        for path, value in holes:
            try:
                digest = await self.blobs.put(value)
            except BlobError as exc:
                raise StoreError(str(exc)) from exc
            refs.append({"path": path, "key": key_of(digest)})
        return {"body": s_attr(body), "texts": s_attr(json.dumps(refs, separators=(",", ":")))}

    async def read_payload(self, item: DynamoItem, what: str) -> str:
        item_version(item, what)  # a newer format is refused before anything is decoded
        if "texts" in item:
            return await self._read_shared(item, what)
        if "body" in item:
            return str(item["body"]["S"])
        if "blob" not in item:
            raise CorruptRowError(f"{what} has neither body nor blob")
        key = str(item["blob"]["S"])
        if self.s3 is None:
            raise StoreError(
                f"{what} is stored in S3 ({key}) but no blob bucket is configured (set STEPAGENT_BLOB_BUCKET)"
            )
        response = await self._s3("GetObject", key)
        try:
            async with response["Body"] as stream:
                data: bytes = await stream.read()
        except (BotoCoreError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            # aiohttp's errors: a body cut while being read (the client's requests map theirs to botocore's).
            raise StoreError(f"S3 GetObject {self.bucket}/{key} failed while reading: {exc}") from exc
        self.metrics.bytes_read += len(data)
        # The key ends with the content hash: check it, so a truncated or swapped object is never decoded.
        if not key.endswith("-" + hashlib.sha256(data).hexdigest()[:16]):
            raise CorruptRowError(f"{what}: S3 object {key} does not match its content hash")
        return data.decode()

    async def _read_shared(self, item: DynamoItem, what: str) -> str:
        """The payload of a ``body`` + ``texts`` item: each text read (or taken from the cache) once."""
        try:
            skeleton = json.loads(str(item["body"]["S"]))
            refs = json.loads(str(item["texts"]["S"]))
            keys = [(list(ref["path"]), str(ref["key"])) for ref in refs]
        except (KeyError, TypeError, ValueError):
            raise CorruptRowError(f"{what} has a malformed skeleton or text list") from None
        if self.blobs is None:
            raise StoreError(
                f"{what} has texts in S3 but no blob bucket is configured (set STEPAGENT_BLOB_BUCKET)"
            )
        holes = []
        for path, key in keys:
            digest = key.removeprefix(key_of(""))
            if key != key_of(digest) or not is_digest(digest):
                raise CorruptRowError(f"{what} names {key!r}, not a content-addressed text")
            try:
                holes.append((path, await self.blobs.get(digest)))
            except BlobCorrupt as exc:
                raise CorruptRowError(f"{what}: {exc}") from None
            except BlobError as exc:
                raise StoreError(f"{what}: {exc}") from exc
        try:
            return dumps(fill(skeleton, holes))
        except ValueError as exc:
            raise CorruptRowError(f"{what}: its texts do not fit its skeleton: {exc}") from None

    async def _s3(self, op: str, key: str, **kwargs: Any) -> Request:
        self.metrics.count_call(f"s3:{op}")
        try:
            response: Request = await getattr(self.s3, _SNAKE.sub("_", op).lower())(
                Bucket=self.bucket, Key=key, **kwargs
            )
        except (ClientError, BotoCoreError, OSError, TimeoutError) as exc:
            raise StoreError(f"S3 {op} {self.bucket}/{key} failed: {exc}") from exc
        return response

    async def query_prefix(self, table: str, pk: str, prefix: str) -> list[DynamoItem]:
        """All items of ``pk`` whose sort key starts with ``prefix`` (small, bounded sets only)."""
        kwargs: Request = {
            "TableName": table,
            "KeyConditionExpression": "#pk = :pk AND begins_with(#sk, :prefix)",
            "ExpressionAttributeNames": {"#pk": "pk", "#sk": "sk"},
            "ExpressionAttributeValues": {":pk": s_attr(pk), ":prefix": s_attr(prefix)},
            "ConsistentRead": True,
        }
        items: list[DynamoItem] = []
        while True:
            page = await self.call("Query", table, **kwargs)
            items.extend(page.get("Items", []))
            if not page.get("LastEvaluatedKey"):
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    async def batch_get(
        self, table: str, keys: Sequence[DynamoItem], *, keys_only: bool = False
    ) -> list[DynamoItem]:
        """Consistent BatchGetItem in chunks of 100, retrying ``UnprocessedKeys`` with backoff."""
        found: list[DynamoItem] = []
        for chunk in chunks(keys, _BATCH_GET_KEYS):
            spec: Request = {"Keys": list(chunk), "ConsistentRead": True}
            if keys_only:
                spec.update(ProjectionExpression="#sk", ExpressionAttributeNames={"#sk": "sk"})
            found.extend((await self._batch_get_request({table: spec}, table)).get(table, []))
        return found

    async def batch_get_many(self, keys: Sequence[tuple[str, DynamoItem]]) -> dict[str, list[DynamoItem]]:
        """Consistent BatchGetItem of ``(table, key)`` pairs over any tables: one request per 100 keys
        (plus retries of ``UnprocessedKeys``); the found items by table."""
        found: dict[str, list[DynamoItem]] = {}
        for chunk in chunks(keys, _BATCH_GET_KEYS):
            request: Request = {}
            for table, key in chunk:
                request.setdefault(table, {"Keys": [], "ConsistentRead": True})["Keys"].append(key)
            for table, items in (await self._batch_get_request(request, ",".join(request))).items():
                found.setdefault(table, []).extend(items)
        return found

    async def _batch_get_request(self, request: Request, label: str) -> dict[str, list[DynamoItem]]:
        """One BatchGetItem ``request`` (at most 100 keys), retrying ``UnprocessedKeys`` with backoff; the
        found items by table. ``label`` names the table(s) in the metrics and the error."""
        found: dict[str, list[DynamoItem]] = {}
        for attempt in range(BATCH_BACKOFF.attempts):
            response = await self.call("BatchGetItem", label, RequestItems=request)
            for table, items in (response.get("Responses") or {}).items():
                found.setdefault(table, []).extend(items)
            request = response.get("UnprocessedKeys") or {}
            if not request:
                return found
            await asyncio.sleep(BATCH_BACKOFF.delay(attempt + 1))
        raise StoreError(f"DynamoDB BatchGetItem on {label}: keys still unprocessed after retries")

    async def batch_put(self, table: str, items: Sequence[DynamoItem]) -> None:
        """BatchWriteItem in chunks of 25, retrying ``UnprocessedItems`` with backoff."""
        items = [stamped(item) for item in items]
        await self._batch_write(table, [{"PutRequest": {"Item": item}} for item in items], items)

    async def batch_delete(self, table: str, keys: Sequence[DynamoItem]) -> None:
        """BatchWriteItem deletes in chunks of 25 (absent keys are fine), retrying unprocessed ones."""
        unique = list({(str(k["pk"]["S"]), str(k["sk"]["S"])): k for k in keys}.values())
        await self._batch_write(table, [{"DeleteRequest": {"Key": key}} for key in unique], unique)

    async def delete_blob(self, key: str) -> None:
        await self._s3("DeleteObject", key)

    async def _batch_write(
        self, table: str, requests: Sequence[Request], items: Sequence[DynamoItem]
    ) -> None:
        for start in range(0, len(requests), _BATCH_WRITE_ITEMS):
            chunk = items[start : start + _BATCH_WRITE_ITEMS]
            request: Request = {table: list(requests[start : start + _BATCH_WRITE_ITEMS])}
            for attempt in range(BATCH_BACKOFF.attempts):
                response = await self.call("BatchWriteItem", table, RequestItems=request)
                request = response.get("UnprocessedItems") or {}
                if not request:
                    break
                await asyncio.sleep(BATCH_BACKOFF.delay(attempt + 1))
            else:
                raise StoreError(
                    f"DynamoDB BatchWriteItem on table {table}: items still unprocessed after retries"
                )
            self.metrics.items_written += len(chunk)
            self.metrics.bytes_written += sum(item_size(item) for item in chunk)

    async def transact(
        self,
        table: str,
        writes: Sequence[Write],
        *,
        token: str | None = None,
        retry_if: Callable[[list[str]], bool] = conflicted,
    ) -> None:
        """``writes`` as one ``TransactWriteItems`` (``table`` names it in the metrics and errors), counted
        as written when it succeeds.

        A cancellation whose reasons ``retry_if`` accepts (by default :func:`conflicted`) is sent again
        after :data:`CONFLICT_BACKOFF`'s wait, up to its attempts; any other cancellation, or the last one,
        is raised as :class:`TransactionCancelled` for the caller to classify. ``token`` is the first
        attempt's ``ClientRequestToken`` (so botocore's own retry of a request whose response was lost is
        idempotent); each later attempt is a new request and gets a token of its own."""
        actions = [w.action() for w in writes]
        for attempt in range(1, CONFLICT_BACKOFF.attempts + 1):
            kwargs: dict[str, Any] = {"TransactItems": actions}
            if token is not None:
                kwargs["ClientRequestToken"] = token if attempt == 1 else f"{token[:32]}-r{attempt}"
            try:
                await self.call("TransactWriteItems", table, **kwargs)
            except TransactionCancelled as exc:
                if attempt < CONFLICT_BACKOFF.attempts and retry_if(exc.reasons):
                    await asyncio.sleep(CONFLICT_BACKOFF.delay(attempt))
                    continue
                raise
            self.count_written(writes)
            return

    async def write(self, write: Write) -> None:
        """One write as PutItem/UpdateItem/DeleteItem (raises ``ConditionFailed`` on a refused condition)."""
        await self.call(f"{write.kind}Item", write.request["TableName"], **write.request)
        self.count_written([write])


def marker_item(thread_id: str, sk: str) -> DynamoItem:
    """A processed/answered marker item: its key and a TTL (``expires_at``) of ``MARKER_TTL_S``."""
    return {**item_key(thread_id, sk), "expires_at": n_attr(int(time.time()) + MARKER_TTL_S)}


async def payload_write(io: DynamoIo, table: str, pk: str, sk: str, text: str, seq: int | None) -> Write:
    """Upsert of a JSON payload item; ``seq`` (insertion order) is kept from the first insert, the way a
    dict keeps a replaced key's position."""
    attrs = await io.payload(text, f"state/{pk}/{sk}")
    present = sorted(attrs)
    absent = [name for name in PAYLOAD_ATTRIBUTES if name not in attrs]
    names = {f"#p{i}": name for i, name in enumerate(present)} | {f"#a{i}": n for i, n in enumerate(absent)}
    values: DynamoItem = {f":p{i}": attrs[name] for i, name in enumerate(present)}
    expression = "SET " + ", ".join(f"#p{i} = :p{i}" for i in range(len(present)))
    if seq is not None:
        names["#seq"] = "seq"
        values[":seq"] = n_attr(seq)
        expression += ", #seq = if_not_exists(#seq, :seq)"
    expression += " REMOVE " + ", ".join(f"#a{i}" for i in range(len(absent)))
    return update(table, item_key(pk, sk), expression, names, values)


def fits(writes: Sequence[Write]) -> bool:
    """Whether ``writes`` fit one TransactWriteItems call."""
    return len(writes) <= MAX_TRANSACT_ACTIONS and sum(w.size for w in writes) <= TRANSACT_BYTE_BUDGET


def transaction_chunks(writes: Sequence[Write], reserve: int) -> Iterator[list[Write]]:
    """Greedy chunks of ``writes`` that each fit one transaction next to ``reserve`` small extra actions."""
    chunk: list[Write] = []
    size = 0
    for write in writes:
        full = len(chunk) + reserve >= MAX_TRANSACT_ACTIONS or size + write.size > TRANSACT_BYTE_BUDGET
        if chunk and full:
            yield chunk
            chunk, size = [], 0
        chunk.append(write)
        size += write.size
    if chunk:
        yield chunk


class _MonotonicSeq:
    """Insertion order for items written outside commits (no head version to order by): wall-clock
    nanoseconds, forced strictly increasing within the process. Across processes it relies on clocks,
    which is enough for writes that a thread's serialized steps make one after another."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._last = max(time.time_ns(), self._last + 1)
            return self._last


insertion_seq = _MonotonicSeq().next
