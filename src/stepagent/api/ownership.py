"""Which subject owns which conversation: an ``OWNER`` item per root thread in the state table.

A thread is owned by the subject whose first message created it through the API (a conditional
``PutItem``, so two first messages racing cannot both claim it). Every route checks it: a thread owned by
another subject, or not created through the API at all, is reported as not found — the same answer as
an unknown thread, so ids cannot be probed. Without authentication (``none``, loopback only) the caller
may also reach threads nobody owns (those made by ``stepagent run`` or the CLI). An owner never changes,
so confirmed pairs are remembered (a bounded cache) and cost no read afterwards.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from stepagent.api.auth import ANONYMOUS
from stepagent.stores.base import ConversationStore
from stepagent.stores.dynamodb_io import ConditionFailed, DynamoIo, item_key, put, s_attr
from stepagent.stores.dynamodb_quotas import OWNER_SK

_CACHED = 10_000


class Ownership:
    """Owner records of one state table."""

    def __init__(self, io: DynamoIo, state_table: str, conversation: ConversationStore) -> None:
        self.io = io
        self.table = state_table
        self.conversation = conversation
        self._known: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._checking: dict[tuple[str, str], asyncio.Future[bool]] = {}

    async def owner(self, thread: str) -> str | None:
        response = await self.io.call(
            "GetItem", self.table, TableName=self.table, Key=item_key(thread, OWNER_SK), ConsistentRead=True
        )
        item = response.get("Item")
        return str(item["owner"]["S"]) if item else None

    async def may_read(self, thread: str, subject: str) -> bool:
        """Whether ``subject`` may see ``thread`` (it exists or was claimed, and is theirs). Concurrent
        checks of one pair share their reads (a burst of reconnecting streams reads once)."""
        key = (thread, subject)
        if key in self._known:
            return True
        pending = self._checking.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._may_read(thread, subject))
            self._checking[key] = pending
            pending.add_done_callback(lambda _: self._checking.pop(key, None))
        return await asyncio.shield(pending)

    async def _may_read(self, thread: str, subject: str) -> bool:
        owner = await self.owner(thread)
        if owner is None:
            allowed = subject == ANONYMOUS and await self.conversation.get_thread(thread) is not None
        else:
            allowed = owner == subject
        if allowed:
            self._remember(thread, subject)
        return allowed

    async def claim(self, thread: str, subject: str) -> bool:
        """Make ``subject`` the owner of a new ``thread``; whether ``subject`` may write to it."""
        if (thread, subject) in self._known:
            return True
        owner = await self.owner(thread)
        if owner is None:
            if await self.conversation.get_thread(thread) is not None:
                # Made outside the API: nobody may claim it, only reach it without authentication.
                allowed = subject == ANONYMOUS
                if allowed:
                    self._remember(thread, subject)
                return allowed
            record = {**item_key(thread, OWNER_SK), "owner": s_attr(subject)}
            try:
                await self.io.write(put(self.table, record, "attribute_not_exists(#pk)", {"#pk": "pk"}))
                owner = subject
            except ConditionFailed:
                owner = await self.owner(thread)
        allowed = owner == subject
        if allowed:
            self._remember(thread, subject)
        return allowed

    async def unclaimed(self, thread: str, subject: str) -> bool:
        """Whether ``thread`` has no owner yet (a message to it would create a conversation)."""
        return (thread, subject) not in self._known and await self.owner(thread) is None

    def _remember(self, thread: str, subject: str) -> None:
        self._known[(thread, subject)] = None
        if len(self._known) > _CACHED:
            self._known.popitem(last=False)
