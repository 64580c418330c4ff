"""Claim check for queue bodies: payloads too big for SQS travel through the blob bucket.

Guarantees:

- :func:`wrap_body` leaves a body of at most :data:`INLINE_BODY_LIMIT` UTF-8 bytes unchanged. A larger
  JSON body becomes a **v2** envelope: its large strings (see :func:`stepagent.blobs.split`) are stored as
  content-addressed texts, ``blobs/sha256/<hex of the text>``, shared with the history row and the output
  event that repeat them (:class:`~stepagent.blobs.ContentBlobs` writes a text this process knows exists
  no second time), and the rest of the body travels inline::

      {"stepagent_claim_check": {"v": 2, "bucket": "...", "body": <the body, large strings as "">,
                                 "texts": [{"path": ["content", "content", 0, "text"],
                                            "key": "blobs/sha256/<hex>", "sha256": "<hex>", "size": <bytes>}]}}

- A body that is not canonical JSON (:func:`stepagent.blobs.canonical`), or still too big without its
  large strings, falls back to the **v1** envelope:
  the whole body at ``payloads/<sha256 of the body>``::

      {"stepagent_claim_check": {"v": 1, "bucket": "...", "key": "payloads/<sha256>",
                                 "sha256": "<hex>", "size": <bytes>}}

- :func:`unwrap_body` turns either envelope back into the original body and verifies every hash; any
  other body is returned unchanged, and every body comes back byte-identical (v2 is only used for a
  canonical body, which :func:`stepagent.blobs.dumps` reassembles exactly).
  An envelope is recognised only when it is the body's *only* top-level key, so no valid input message is
  ever mistaken for one. Each text is read at most once per process while it stays in the blobs' cache.
- Errors are classified for the worker: a broken envelope, a missing object, a hash mismatch or a foreign
  bucket can never succeed on retry (:class:`~stepagent.errors.MalformedMessageError`); an S3 outage can
  (:class:`~stepagent.errors.QueueError`). Without a bucket, a big body is
  :class:`~stepagent.errors.PayloadTooLargeError`.

Retention: the bucket's lifecycle rule expires ``payloads/`` (v1, queue-only copies) after 30 days, longer
than any queue's retention; ``blobs/`` never expires, since rows may name the same objects (see
:mod:`stepagent.blobs`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from stepagent.blobs import (
    BlobCorrupt,
    BlobError,
    BlobMissing,
    ContentBlobs,
    Path,
    canonical,
    dumps,
    fill,
    is_digest,
    key_of,
    split,
)
from stepagent.errors import MalformedMessageError, PayloadTooLargeError, QueueError

ENVELOPE_KEY = "stepagent_claim_check"
ENVELOPE_VERSION = 2
#: Bodies above this many UTF-8 bytes go to S3. SQS accepts up to 256 KiB (1 MiB on newer queues) for body
#: plus attributes; 200 KB leaves room for attributes and any size estimate error.
INLINE_BODY_LIMIT = 200_000
PAYLOAD_PREFIX = "payloads/"
# A v1 envelope is ~250 bytes; a longer body is an envelope only if it starts the way ours are written, so
# an ordinary body is never parsed twice.
_MAX_V1_ENVELOPE_BYTES = 2_000
_ENVELOPE_START = '{"' + ENVELOPE_KEY + '":'


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


async def wrap_body(body: str, blobs: ContentBlobs | None, *, limit: int = INLINE_BODY_LIMIT) -> str:
    """``body`` itself when small enough, else a v2 envelope (its large texts by reference) or, when that
    cannot fit, the v1 envelope of the whole body's S3 copy."""
    data = body.encode("utf-8")
    if len(data) <= limit:
        return body
    if blobs is None:
        raise PayloadTooLargeError(
            f"a queue body of {len(data)} bytes exceeds {limit} bytes and no blob bucket is configured "
            "(set STEPAGENT_BLOB_BUCKET)"
        )
    envelope = _by_reference(body, blobs.bucket)
    if envelope is not None and len(wire := dumps(envelope[0]).encode("utf-8")) <= limit:
        for text in envelope[1]:
            try:
                await blobs.put(text)
            except BlobError as exc:
                raise QueueError(f"storing a queue payload's text failed: {exc}") from exc
        return wire.decode("utf-8")
    return await _whole_body(data, blobs)


def _by_reference(body: str, bucket: str) -> tuple[dict[str, Any], list[str]] | None:
    """The v2 envelope of a JSON ``body`` and the texts it references, or ``None`` (not JSON, no large
    string)."""
    parsed, doc = canonical(body)
    if not parsed:
        return None
    skeleton, holes = split(doc)
    if not holes:
        return None
    texts = []
    for path, text in holes:
        data = text.encode("utf-8")
        digest = hashlib.sha256(data).hexdigest()
        texts.append({"path": path, "key": key_of(digest), "sha256": digest, "size": len(data)})
    fields = {"v": ENVELOPE_VERSION, "bucket": bucket, "body": skeleton, "texts": texts}
    return {ENVELOPE_KEY: fields}, [text for _, text in holes]


async def _whole_body(data: bytes, blobs: ContentBlobs) -> str:
    digest = hashlib.sha256(data).hexdigest()
    key = f"{PAYLOAD_PREFIX}{digest}"
    if blobs.metrics is not None:
        blobs.metrics.count_call("s3:PutObject")
    try:
        await blobs.s3.put_object(Bucket=blobs.bucket, Key=key, Body=data, ContentType="application/json")
    except (ClientError, BotoCoreError, OSError) as exc:
        raise QueueError(
            f"storing a {len(data)}-byte queue payload in s3://{blobs.bucket}/{key} failed: {exc}"
        ) from exc
    if blobs.metrics is not None:
        blobs.metrics.bytes_written += len(data)
    fields = {"v": 1, "bucket": blobs.bucket, "key": key, "sha256": digest, "size": len(data)}
    return dumps({ENVELOPE_KEY: fields})


def envelope_of(body: str) -> dict[str, Any] | None:
    """The envelope's fields if ``body`` is a claim-check envelope, else ``None`` (cheap for normal bodies)."""
    if ENVELOPE_KEY not in body[:_MAX_V1_ENVELOPE_BYTES]:
        return None
    if len(body) > _MAX_V1_ENVELOPE_BYTES and not body.startswith(_ENVELOPE_START):
        return None
    try:
        raw = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(raw, dict) or set(raw) != {ENVELOPE_KEY}:
        return None
    fields = raw[ENVELOPE_KEY]
    if not isinstance(fields, dict):
        raise MalformedMessageError(f"{ENVELOPE_KEY} must be an object", field=ENVELOPE_KEY)
    return fields


async def unwrap_body(body: str, blobs: ContentBlobs | None) -> str:
    """The original body behind an envelope (verified), or ``body`` unchanged when it is not one."""
    fields = envelope_of(body)
    if fields is None:
        return body
    version = fields.get("v")
    if version not in (1, ENVELOPE_VERSION):
        raise MalformedMessageError(f"unsupported claim-check version {version!r}", field=ENVELOPE_KEY)
    where = fields.get("bucket")
    if not isinstance(where, str) or not where:
        raise MalformedMessageError("a claim check needs a string 'bucket'", field=ENVELOPE_KEY)
    if blobs is None:
        raise QueueError(
            "received a claim-checked body but no blob bucket is configured (STEPAGENT_BLOB_BUCKET)"
        )
    if where != blobs.bucket:
        # Only our own bucket: a producer must not make the runtime read arbitrary objects.
        raise MalformedMessageError(
            f"claim check names bucket {where!r}, not {blobs.bucket!r}", field=ENVELOPE_KEY
        )
    if version == 1:
        return await _read_whole_body(fields, blobs)
    holes = await _read_texts(fields, blobs)
    try:
        return dumps(fill(fields["body"], holes))
    except ValueError as exc:
        raise MalformedMessageError(f"a claim check's texts do not fit its body: {exc}") from None


def _references(fields: dict[str, Any]) -> list[tuple[Path, str]]:
    """The (path, sha256) of each text a v2 envelope references, validated."""
    texts = fields.get("texts")
    if "body" not in fields or not isinstance(texts, list) or not texts:
        raise MalformedMessageError("a v2 claim check needs 'body' and a list of 'texts'", field=ENVELOPE_KEY)
    refs: list[tuple[Path, str]] = []
    for ref in texts:
        path, digest = (ref.get("path"), ref.get("sha256")) if isinstance(ref, dict) else (None, None)
        if (
            not isinstance(path, list)
            or not all(isinstance(p, str | int) for p in path)
            or not is_digest(digest)
            or ref.get("key") != key_of(str(digest))
        ):
            raise MalformedMessageError(
                "each claim-checked text needs a 'path', a hex 'sha256' and its 'key'", field=ENVELOPE_KEY
            )
        refs.append((path, str(digest)))
    return refs


async def _read_texts(fields: dict[str, Any], blobs: ContentBlobs) -> list[tuple[Path, str]]:
    holes: list[tuple[Path, str]] = []
    for path, digest in _references(fields):
        try:
            holes.append((path, await blobs.get(digest)))
        except (BlobMissing, BlobCorrupt) as exc:
            raise MalformedMessageError(f"claim-checked text {exc}") from None
        except BlobError as exc:
            raise QueueError(f"reading a claim-checked text failed: {exc}") from exc
    return holes


async def _read_whole_body(fields: dict[str, Any], blobs: ContentBlobs) -> str:
    where, key, digest = blobs.bucket, fields.get("key"), fields.get("sha256")
    if not (isinstance(key, str) and key and isinstance(digest, str) and digest):
        raise MalformedMessageError(
            "a claim check needs string 'bucket', 'key' and 'sha256'", field=ENVELOPE_KEY
        )
    if blobs.metrics is not None:
        blobs.metrics.count_call("s3:GetObject")
    try:
        response = await blobs.s3.get_object(Bucket=where, Key=key)
        async with response["Body"] as stream:
            data: bytes = await stream.read()
    except ClientError as exc:
        if _error_code(exc) in ("NoSuchKey", "404", "NotFound"):
            raise MalformedMessageError(f"claim-checked payload s3://{where}/{key} does not exist") from None
        raise QueueError(f"reading claim-checked payload s3://{where}/{key} failed: {exc}") from exc
    except (BotoCoreError, OSError) as exc:
        raise QueueError(f"reading claim-checked payload s3://{where}/{key} failed: {exc}") from exc
    if blobs.metrics is not None:
        blobs.metrics.bytes_read += len(data)
    if hashlib.sha256(data).hexdigest() != digest:
        raise MalformedMessageError(f"claim-checked payload s3://{where}/{key} does not match its sha256")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedMessageError(f"claim-checked payload s3://{where}/{key} is not UTF-8") from None
