"""Claim check for queue bodies: payloads too big for SQS travel through the blob bucket.

Guarantees:

- :func:`wrap_body` leaves a body of at most :data:`INLINE_BODY_LIMIT` UTF-8 bytes unchanged. A larger
  body is put to ``s3://<bucket>/payloads/<sha256 of the body>`` (content-addressed, so a retry rewrites
  the same object) and replaced by a small, versioned envelope::

      {"stepagent_claim_check": {"v": 1, "bucket": "...", "key": "payloads/<sha256>",
                                 "sha256": "<hex>", "size": <bytes>}}

- :func:`unwrap_body` turns an envelope back into the original body and verifies its hash; any other body
  is returned unchanged. An envelope is recognised only when it is the body's *only* top-level key, so no
  valid input message is ever mistaken for one.
- Errors are classified for the worker: a broken envelope, a missing object, a hash mismatch or a foreign
  bucket can never succeed on retry (:class:`~stepagent.errors.MalformedMessageError`); an S3 outage can
  (:class:`~stepagent.errors.QueueError`). Without a bucket, a big body is
  :class:`~stepagent.errors.PayloadTooLargeError`.

The bucket's lifecycle rule expires ``payloads/`` after 30 days, longer than any queue's retention.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, TypeAlias

from botocore.exceptions import BotoCoreError, ClientError

from stepagent.errors import MalformedMessageError, PayloadTooLargeError, QueueError

#: aioboto3 S3 client (untyped).
S3Client: TypeAlias = Any

ENVELOPE_KEY = "stepagent_claim_check"
ENVELOPE_VERSION = 1
#: Bodies above this many UTF-8 bytes go to S3. SQS accepts up to 256 KiB (1 MiB on newer queues) for body
#: plus attributes; 200 KB leaves room for attributes and any size estimate error.
INLINE_BODY_LIMIT = 200_000
PAYLOAD_PREFIX = "payloads/"
# A real envelope is ~250 bytes; anything much larger is not one, so it is never parsed twice.
_MAX_ENVELOPE_BYTES = 2_000


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


async def wrap_body(
    body: str, s3: S3Client | None, bucket: str | None, *, limit: int = INLINE_BODY_LIMIT
) -> str:
    """``body`` itself when small enough, else the envelope of its S3 copy."""
    data = body.encode("utf-8")
    if len(data) <= limit:
        return body
    if s3 is None or not bucket:
        raise PayloadTooLargeError(
            f"a queue body of {len(data)} bytes exceeds {limit} bytes and no blob bucket is configured "
            "(set STEPAGENT_BLOB_BUCKET)"
        )
    digest = hashlib.sha256(data).hexdigest()
    key = f"{PAYLOAD_PREFIX}{digest}"
    try:
        await s3.put_object(Bucket=bucket, Key=key, Body=data, ContentType="application/json")
    except (ClientError, BotoCoreError, OSError) as exc:
        raise QueueError(
            f"storing a {len(data)}-byte queue payload in s3://{bucket}/{key} failed: {exc}"
        ) from exc
    envelope = {
        ENVELOPE_KEY: {
            "v": ENVELOPE_VERSION,
            "bucket": bucket,
            "key": key,
            "sha256": digest,
            "size": len(data),
        }
    }
    return json.dumps(envelope, separators=(",", ":"))


def envelope_of(body: str) -> dict[str, Any] | None:
    """The envelope's fields if ``body`` is a claim-check envelope, else ``None`` (cheap for normal bodies)."""
    if len(body) > _MAX_ENVELOPE_BYTES or ENVELOPE_KEY not in body:
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


async def unwrap_body(body: str, s3: S3Client | None, bucket: str | None) -> str:
    """The original body behind an envelope (verified), or ``body`` unchanged when it is not one."""
    fields = envelope_of(body)
    if fields is None:
        return body
    if fields.get("v") != ENVELOPE_VERSION:
        raise MalformedMessageError(
            f"unsupported claim-check version {fields.get('v')!r}", field=ENVELOPE_KEY
        )
    where, key, digest = fields.get("bucket"), fields.get("key"), fields.get("sha256")
    if not all(isinstance(value, str) and value for value in (where, key, digest)):
        raise MalformedMessageError(
            "a claim check needs string 'bucket', 'key' and 'sha256'", field=ENVELOPE_KEY
        )
    if s3 is None or not bucket:
        raise QueueError(
            "received a claim-checked body but no blob bucket is configured (STEPAGENT_BLOB_BUCKET)"
        )
    if where != bucket:
        # Only our own bucket: a producer must not make the runtime read arbitrary objects.
        raise MalformedMessageError(f"claim check names bucket {where!r}, not {bucket!r}", field=ENVELOPE_KEY)
    try:
        response = await s3.get_object(Bucket=where, Key=key)
        async with response["Body"] as stream:
            data: bytes = await stream.read()
    except ClientError as exc:
        if _error_code(exc) in ("NoSuchKey", "404", "NotFound"):
            raise MalformedMessageError(f"claim-checked payload s3://{where}/{key} does not exist") from None
        raise QueueError(f"reading claim-checked payload s3://{where}/{key} failed: {exc}") from exc
    except (BotoCoreError, OSError) as exc:
        raise QueueError(f"reading claim-checked payload s3://{where}/{key} failed: {exc}") from exc
    if hashlib.sha256(data).hexdigest() != digest:
        raise MalformedMessageError(f"claim-checked payload s3://{where}/{key} does not match its sha256")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedMessageError(f"claim-checked payload s3://{where}/{key} is not UTF-8") from None
