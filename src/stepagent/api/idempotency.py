"""``Idempotency-Key``: the same key means the same request, or an error — never a silently dropped body.

The key is the logical message id, so a retried POST is sent once (the queue and the worker drop the
copy). What a key was first used for is kept as an ``IDEM#{key}`` item under the thread's id in the state
table: a digest of the route and the canonical JSON body (keys sorted), written with a conditional
``PutItem`` so two first uses racing cannot both win, and expiring after :data:`KEY_TTL_S` (the table's
TTL). A later request with the key and the same digest is a retry (sent again; absorbed downstream); one
with another digest is refused (:class:`KeyReused`: 422, as the IETF idempotency-key draft says).
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from stepagent.stores.dynamodb.io import ConditionFailed, DynamoIo, item_key, n_attr, put, s_attr

#: How long a key remembers its request: a day, as Stripe's do.
KEY_TTL_S = 24 * 3600
KEY_PREFIX = "IDEM#"


class KeyReused(Exception):
    """The ``Idempotency-Key`` was used before with another request."""


def request_digest(route: str, body: Any) -> str:
    """SHA-256 of ``route`` and the canonical JSON of ``body``."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{route}\x00{canonical}".encode()).hexdigest()


class IdempotencyKeys:
    """The keys used in one state table."""

    def __init__(self, io: DynamoIo, state_table: str) -> None:
        self.io = io
        self.table = state_table

    async def use(self, thread: str, key: str, digest: str) -> None:
        """Record that ``key`` in ``thread`` means ``digest``; :class:`KeyReused` if it meant another."""
        now = int(time.time())
        record = {
            **item_key(thread, KEY_PREFIX + key),
            "digest": s_attr(digest),
            "expires_at": n_attr(now + KEY_TTL_S),
        }
        # An expired item may outlive its TTL for a while (DynamoDB deletes lazily): it counts as absent.
        condition = "attribute_not_exists(#pk) OR #exp < :now"
        try:
            await self.io.write(
                put(self.table, record, condition, {"#pk": "pk", "#exp": "expires_at"}, {":now": n_attr(now)})
            )
            return
        except ConditionFailed:
            pass
        response = await self.io.call(
            "GetItem",
            self.table,
            TableName=self.table,
            Key=item_key(thread, KEY_PREFIX + key),
            ConsistentRead=True,
        )
        stored = response.get("Item", {}).get("digest", {}).get("S")
        if stored != digest:
            raise KeyReused(
                f"the Idempotency-Key {key!r} was already used for a different request to this thread: "
                "use a new key for a new message"
            )
