"""Per-subject counters on the state table, shared by every process that serves the subject: request
windows, open-stream leases and the day's model spend. Each decision is one conditional write, so two
API instances (two Lambda executions) racing for the last unit cannot both get it.

Items (``pk`` = ``SUBJECT#`` + the SHA-256 of the subject, so any subject string makes a valid key and
no thread id can collide with it):

- ``RATE#{kind}#{window}`` — a fixed-window counter. :meth:`SubjectCounters.take` adds one only if the
  count is below the limit (``ADD`` under a condition); refused, it says how many seconds remain until the
  window ends. TTL'd an hour after its window.
- ``STREAM#{slot}`` for ``slot`` in ``0 .. limit-1`` — one lease per open event stream. A slot is taken
  with a put that succeeds only if the slot is free or its lease has run out; the holder renews it
  (:meth:`SubjectCounters.renew`, conditioned on still holding it) and deletes it when the stream closes. A
  crashed process's lease simply runs out. Why slots and not one item with a map of leases: taking a
  slot is a single conditional write with no read-modify-write loop, so a burst of opens never retries.
- ``SPEND#{day}`` — the subject's model spend on a UTC day, in picodollars (integer ``ADD`` is exact), added
  by the worker after each step for the root thread's owner (:meth:`SubjectCounters.add_spend`).
  TTL'd two days after the day.

The owner of a conversation is its root's ``OWNER`` item (written by the HTTP API when a subject's first
message creates the thread); a thread made any other way has no owner and counts for nobody.

Lease times are wall-clock seconds (``time.time()``): several machines compare them, so each process's
clock is trusted to within the lease's slack.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import secrets
from collections import OrderedDict
from dataclasses import dataclass

from stepagent.stores.dynamodb.io import (
    ConditionFailed,
    DynamoIo,
    DynamoItem,
    item_key,
    n_attr,
    put,
    s_attr,
    update,
)

#: The sort key of a root thread's owner record (the subject that created it through the HTTP API).
OWNER_SK = "OWNER"
_TTL = "expires_at"
_PICO = 10**12
_DAY_S = 86_400
_OWNERS_CACHED = 10_000


def subject_key(subject: str) -> str:
    """The partition key of ``subject``'s counters."""
    return "SUBJECT#" + hashlib.sha256(subject.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Lease:
    """One open stream's hold on a slot: renew it before ``expires``, delete it when the stream ends."""

    subject: str
    slot: int
    holder: str
    expires: float


class SubjectCounters:
    """The counters of one state table (see the module docstring)."""

    def __init__(self, io: DynamoIo, state_table: str) -> None:
        self.io = io
        self.table = state_table
        self._owners: OrderedDict[str, str | None] = OrderedDict()

    # ---- fixed windows ---------------------------------------------------------------------------------

    async def take(self, subject: str, kind: str, limit: int, window_s: int, now: float) -> float | None:
        """Count one ``kind`` request in the current window if fewer than ``limit`` were; ``None`` when
        counted, else the seconds until the window ends."""
        window = int(now // window_s)
        ends = (window + 1) * window_s
        write = update(
            self.table,
            item_key(subject_key(subject), f"RATE#{kind}#{window}"),
            "ADD #n :one SET #ttl = :ttl",
            {"#n": "n", "#ttl": _TTL},
            {":one": n_attr(1), ":limit": n_attr(limit), ":ttl": n_attr(ends + 3600)},
            ConditionExpression="attribute_not_exists(#n) OR #n < :limit",
        )
        try:
            await self.io.write(write)
        except ConditionFailed:
            return max(0.0, ends - now)
        return None

    # ---- stream leases ---------------------------------------------------------------------------------

    async def acquire(self, subject: str, limit: int, now: float, lease_s: float) -> Lease | None:
        """A free (or expired) slot of ``subject``'s ``limit``, leased for ``lease_s``; ``None`` when every
        slot is held. One consistent query finds the candidates; each attempt is a conditional put."""
        response = await self.io.call(
            "Query",
            self.table,
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
            ExpressionAttributeValues={":pk": s_attr(subject_key(subject)), ":prefix": s_attr("STREAM#")},
            ConsistentRead=True,
        )
        held = {
            int(item["sk"]["S"].removeprefix("STREAM#"))
            for item in response.get("Items", [])
            if float(item["lease"]["N"]) > now
        }
        free = [slot for slot in range(limit) if slot not in held]
        secrets.SystemRandom().shuffle(free)  # concurrent openers spread over the free slots
        holder = secrets.token_hex(8)
        expires = now + lease_s
        for slot in free:
            item: DynamoItem = {
                **item_key(subject_key(subject), f"STREAM#{slot}"),
                "holder": s_attr(holder),
                "lease": {"N": repr(expires)},
                _TTL: n_attr(math.ceil(expires) + 3600),
            }
            condition = "attribute_not_exists(#pk) OR #lease <= :now"
            try:
                await self.io.write(
                    put(
                        self.table,
                        item,
                        condition,
                        {"#pk": "pk", "#lease": "lease"},
                        {":now": {"N": repr(now)}},
                    )
                )
            except ConditionFailed:
                continue  # taken by a concurrent opener since the query
            return Lease(subject, slot, holder, expires)
        return None

    async def renew(self, lease: Lease, now: float, lease_s: float) -> Lease | None:
        """The lease extended to ``now + lease_s``; ``None`` when it is lost: it ran out (even if no other
        stream has taken the slot yet — an expired lease is free for the taking) or was taken."""
        expires = now + lease_s
        write = update(
            self.table,
            item_key(subject_key(lease.subject), f"STREAM#{lease.slot}"),
            "SET #lease = :lease, #ttl = :ttl",
            {"#lease": "lease", "#ttl": _TTL, "#holder": "holder"},
            {
                ":lease": {"N": repr(expires)},
                ":ttl": n_attr(math.ceil(expires) + 3600),
                ":holder": s_attr(lease.holder),
                ":now": {"N": repr(now)},
            },
            ConditionExpression="#holder = :holder AND #lease > :now",
        )
        try:
            await self.io.write(write)
        except ConditionFailed:
            return None
        return Lease(lease.subject, lease.slot, lease.holder, expires)

    async def release(self, lease: Lease) -> None:
        """Free the slot, if this lease still holds it."""
        # A refused condition: another stream holds the slot now, nothing of ours to free.
        with contextlib.suppress(ConditionFailed):
            await self.io.call(
                "DeleteItem",
                self.table,
                TableName=self.table,
                Key=item_key(subject_key(lease.subject), f"STREAM#{lease.slot}"),
                ConditionExpression="#holder = :holder",
                ExpressionAttributeNames={"#holder": "holder"},
                ExpressionAttributeValues={":holder": s_attr(lease.holder)},
            )

    # ---- daily spend -----------------------------------------------------------------------------------

    async def owner(self, root_id: str) -> str | None:
        """The subject that owns the conversation ``root_id`` (cached: an owner never changes, and a root
        that exists without one never gets one)."""
        if root_id in self._owners:
            self._owners.move_to_end(root_id)
            return self._owners[root_id]
        response = await self.io.call(
            "GetItem", self.table, TableName=self.table, Key=item_key(root_id, OWNER_SK), ConsistentRead=True
        )
        item = response.get("Item")
        owner = str(item["owner"]["S"]) if item else None
        self._owners[root_id] = owner
        if len(self._owners) > _OWNERS_CACHED:
            self._owners.popitem(last=False)
        return owner

    async def add_spend(self, root_id: str, cost_usd: float, now: float) -> None:
        """Add ``cost_usd`` to the day's spend of ``root_id``'s owner (nothing when it has none)."""
        if cost_usd <= 0:
            return
        owner = await self.owner(root_id)
        if owner is None:
            return
        day = int(now // _DAY_S)
        write = update(
            self.table,
            item_key(subject_key(owner), f"SPEND#{day}"),
            "ADD #p :p SET #ttl = :ttl",
            {"#p": "pusd", "#ttl": _TTL},
            {":p": n_attr(round(cost_usd * _PICO)), ":ttl": n_attr((day + 3) * _DAY_S)},
        )
        await self.io.write(write)

    async def spent_today(self, subject: str, now: float) -> tuple[float, float]:
        """(dollars ``subject`` spent this UTC day, seconds until the day ends)."""
        day = int(now // _DAY_S)
        response = await self.io.call(
            "GetItem",
            self.table,
            TableName=self.table,
            Key=item_key(subject_key(subject), f"SPEND#{day}"),
            ConsistentRead=True,
        )
        item = response.get("Item")
        spent = int(item["pusd"]["N"]) / _PICO if item else 0.0
        return spent, (day + 1) * _DAY_S - now
