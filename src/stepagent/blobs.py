"""Large texts stored once in the blob bucket, by content, and shared by queue bodies, history rows and
output events.

Guarantees:

- A text is one object, ``blobs/sha256/<hex>`` where ``<hex>`` is the SHA-256 of its UTF-8 bytes. The key
  *is* the content: putting the same text again writes the same bytes, so a retry or a concurrent writer is
  harmless, and an object never changes after it is written.
- :meth:`ContentBlobs.put` skips the ``PutObject`` when this process already knows the object exists
  (it put or read it before: e.g. the step's input arrived by reference, so the row and the output event
  that repeat its text write nothing to S3).
- :meth:`ContentBlobs.get` verifies the hash before returning: a swapped or truncated object raises
  :class:`BlobCorrupt`, an absent one :class:`BlobMissing`, an outage :class:`BlobUnavailable` (callers map
  them to their own error classes). A text this process put or read recently is served from a bounded
  in-process cache (:data:`TEXT_CACHE_BYTES`), so a step whose large texts fit in it reads each object at
  most once (texts beyond it are read again when needed again: correct, just dearer).
- :func:`split` turns a JSON document into a *skeleton* (each string of at least :data:`TEXT_MIN_BYTES`
  UTF-8 bytes replaced by ``""``) and the list of its holes (JSON path, text); :func:`fill` puts the texts
  back. The same text in a queue body, a row and an output event therefore maps to the same object.
  Only a *canonical* payload (:func:`canonical`: :func:`dumps` of its parsed value gives back the very
  same text, as our own encoders write) is split, so reassembling it is byte-exact.
- Retention: nothing deletes objects under ``blobs/`` — no rewind, replacement, sweep or lifecycle rule —
  because any number of rows, queue messages and output events may name one object and no reference count
  is kept. The cost is honest storage growth: an object no longer named by anything (a rewound row's text,
  a rejected message's) stays in the bucket until an offline sweep removes it (not implemented).

Counting: every S3 call is reported to ``metrics.count_call("s3:PutObject" | "s3:GetObject")`` and the
object bytes to ``metrics.bytes_written`` / ``metrics.bytes_read`` (a
:class:`~stepagent.stores.metrics.StoreMetrics` fits), whoever made the call: queue, store or publisher.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError

if TYPE_CHECKING:  # the types-aiobotocore stubs: a development dependency, never imported at run time
    from types_aiobotocore_s3 import S3Client

#: A JSON path: object keys and list indexes from the document's root.
Path: TypeAlias = list[str | int]

BLOB_PREFIX = "blobs/sha256/"
#: Strings at least this big (UTF-8 bytes) become their own object when their document is too big to
#: travel or be stored inline. Smaller ones stay in the skeleton: an object per short string would cost
#: more requests than it saves bytes.
TEXT_MIN_BYTES = 32_000
#: The in-process cache of recently put or read texts, in UTF-8 bytes: enough for a few multi-megabyte
#: texts, so one step does not read one twice; a text bigger than the whole cache is never cached.
TEXT_CACHE_BYTES = 16_000_000
#: How many object keys this process remembers as existing.
KNOWN_KEYS = 8_192
_HEX = re.compile(r"[0-9a-f]{64}")


class BlobMetrics(Protocol):
    """Where S3 calls and bytes are counted (``StoreMetrics`` has this shape)."""

    bytes_written: int
    bytes_read: int

    def count_call(self, operation: str) -> None: ...


class BlobError(Exception):
    """A content-addressed object could not be read or written."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


class BlobMissing(BlobError):
    """The object does not exist."""


class BlobCorrupt(BlobError):
    """The object's bytes do not match the SHA-256 its key names, or are not UTF-8."""


class BlobUnavailable(BlobError):
    """S3 failed (transient)."""


def digest_of(text: str) -> str:
    """The hex SHA-256 of ``text``'s UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def key_of(digest: str) -> str:
    """The object key of the text whose SHA-256 is ``digest``."""
    return f"{BLOB_PREFIX}{digest}"


def is_digest(value: object) -> bool:
    """Whether ``value`` is a lower-case hex SHA-256 (what a reference must carry)."""
    return isinstance(value, str) and _HEX.fullmatch(value) is not None


def dumps(doc: Any) -> str:
    """The canonical JSON text of ``doc``: compact, non-ASCII kept (how rows, messages and events are
    written)."""
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def canonical(text: str) -> tuple[bool, Any]:
    """(``True``, the parsed value) when ``text`` is JSON that :func:`dumps` reproduces exactly, else
    (``False``, ``None``): a payload in any other form is never split, so no byte of it can change."""
    try:
        doc = json.loads(text)
    except ValueError:
        return False, None
    return (True, doc) if dumps(doc) == text else (False, None)


def split(doc: Any, min_bytes: int = TEXT_MIN_BYTES) -> tuple[Any, list[tuple[Path, str]]]:
    """``doc`` with every string of at least ``min_bytes`` UTF-8 bytes replaced by ``""``, and the (path,
    text) of each, depth first. ``doc`` itself is not changed."""
    holes: list[tuple[Path, str]] = []

    def walk(value: Any, path: Path) -> Any:
        # Four UTF-8 bytes per character at most: a shorter string cannot reach min_bytes, so most
        # strings are never encoded.
        if isinstance(value, str):
            if len(value) * 4 >= min_bytes and len(value.encode("utf-8")) >= min_bytes:
                holes.append((path, value))
                return ""
            return value
        if isinstance(value, dict):
            return {name: walk(item, [*path, name]) for name, item in value.items()}
        if isinstance(value, list):
            return [walk(item, [*path, index]) for index, item in enumerate(value)]
        return value

    return walk(doc, []), holes


def fill(skeleton: Any, holes: list[tuple[Path, str]]) -> Any:
    """Put each hole's text back at its path (in place); the filled document. Raises ``ValueError`` when a
    path does not lead to a ``""`` in ``skeleton``."""
    for path, text in holes:
        if not path:
            if skeleton != "":
                raise ValueError("the root is not a hole")
            skeleton = text
            continue
        parent = skeleton
        try:
            for step in path[:-1]:
                parent = parent[step]
            if parent[path[-1]] != "":
                raise ValueError(f"path {path!r} is not a hole")
            parent[path[-1]] = text
        except (KeyError, IndexError, TypeError):
            raise ValueError(f"path {path!r} does not exist in the document") from None
    return skeleton


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class ContentBlobs:
    """Content-addressed texts in ``bucket``, with this process's memory of what exists."""

    def __init__(
        self,
        s3: S3Client,
        bucket: str,
        metrics: BlobMetrics | None = None,
        *,
        cache_bytes: int = TEXT_CACHE_BYTES,
    ) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.metrics = metrics
        self.cache_bytes = cache_bytes
        self._known: OrderedDict[str, None] = OrderedDict()
        self._texts: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._cached = 0

    async def put(self, text: str) -> str:
        """Store ``text`` (unless known to exist); its digest."""
        data = text.encode("utf-8")
        digest = hashlib.sha256(data).hexdigest()
        if digest in self._known:
            self._known.move_to_end(digest)
        else:
            key = key_of(digest)
            self._count("s3:PutObject")
            try:
                await self.s3.put_object(
                    Bucket=self.bucket, Key=key, Body=data, ContentType="text/plain; charset=utf-8"
                )
            except (ClientError, BotoCoreError, OSError, TimeoutError) as exc:
                raise BlobUnavailable(f"S3 PutObject {self.bucket}/{key} failed: {exc}", key) from exc
            if self.metrics is not None:
                self.metrics.bytes_written += len(data)
            self._remember(digest)
        self._cache(digest, text, len(data))
        return digest

    async def get(self, digest: str) -> str:
        """The text whose SHA-256 is ``digest`` (verified), from the cache or one ``GetObject``."""
        cached = self._texts.get(digest)
        if cached is not None:
            self._texts.move_to_end(digest)
            return cached[0]
        key = key_of(digest)
        self._count("s3:GetObject")
        try:
            response = await self.s3.get_object(Bucket=self.bucket, Key=key)
            async with response["Body"] as stream:
                data: bytes = await stream.read()
        except ClientError as exc:
            if _error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                raise BlobMissing(f"s3://{self.bucket}/{key} does not exist", key) from None
            raise BlobUnavailable(f"S3 GetObject {self.bucket}/{key} failed: {exc}", key) from exc
        except (BotoCoreError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            # aiohttp's errors: a body cut while being read (the client's requests map theirs to botocore's).
            raise BlobUnavailable(f"S3 GetObject {self.bucket}/{key} failed: {exc}", key) from exc
        if self.metrics is not None:
            self.metrics.bytes_read += len(data)
        if hashlib.sha256(data).hexdigest() != digest:
            raise BlobCorrupt(f"s3://{self.bucket}/{key} does not match its sha256", key)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise BlobCorrupt(f"s3://{self.bucket}/{key} is not UTF-8", key) from None
        self._remember(digest)
        self._cache(digest, text, len(data))
        return text

    def _count(self, operation: str) -> None:
        if self.metrics is not None:
            self.metrics.count_call(operation)

    def _remember(self, digest: str) -> None:
        self._known[digest] = None
        if len(self._known) > KNOWN_KEYS:
            self._known.popitem(last=False)

    def _cache(self, digest: str, text: str, size: int) -> None:
        if size > self.cache_bytes or digest in self._texts:
            return
        self._texts[digest] = (text, size)
        self._cached += size
        while self._cached > self.cache_bytes:
            _, (_, evicted) = self._texts.popitem(last=False)
            self._cached -= evicted
