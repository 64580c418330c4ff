"""Which subject owns which conversation: an ``OWNER`` item per root thread in the state table.

A root thread is owned by the subject whose first message created it through the API (a conditional
``PutItem``, so two first messages racing cannot both claim it). A thread the store records under another
root (a child, an event or compaction thread) belongs to that root's owner: its head names its root, and
that record — not any owner item under the child's own id — decides. Every route checks it: a thread owned
by another subject, or one nobody owns (made by ``stepagent run`` or the CLI, not through the API), is
reported as not found — the same answer as an unknown thread.

Who may reach what depends on the mode, never on a subject's value: with authentication (``jwt``) only
the owner; without it (``none``, loopback only: ``open_access``) any caller may also reach the threads
nobody owns. An owner never changes, so confirmed pairs are remembered (a bounded cache) and cost no read
afterwards.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from stepagent.stores.base import ConversationStore, ThreadInfo
from stepagent.stores.dynamodb.io import ConditionFailed, DynamoIo, item_key, put, s_attr
from stepagent.stores.dynamodb.quotas import OWNER_SK

_CACHED = 10_000


class Ownership:
    """Owner records of one state table."""

    def __init__(
        self, io: DynamoIo, state_table: str, conversation: ConversationStore, *, open_access: bool = False
    ) -> None:
        self.io = io
        self.table = state_table
        self.conversation = conversation
        #: Without authentication: threads nobody owns are reachable too.
        self.open_access = open_access
        self._known: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._checking: dict[tuple[str, str], asyncio.Future[bool]] = {}

    async def owner(self, thread: str) -> str | None:
        response = await self.io.call(
            "GetItem", self.table, TableName=self.table, Key=item_key(thread, OWNER_SK), ConsistentRead=True
        )
        item = response.get("Item")
        return str(item["owner"]["S"]) if item else None

    async def _record_and_owner(self, thread: str) -> tuple[ThreadInfo | None, str | None]:
        """The store's record of ``thread`` and the owner of its tree (read under its root's id)."""
        info, owner = await asyncio.gather(self.conversation.get_thread(thread), self.owner(thread))
        if info is not None and info.root_id != thread:
            owner = await self.owner(info.root_id)
        return info, owner

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
        info, owner = await self._record_and_owner(thread)
        # Nobody's thread: reachable only without authentication (and only if it exists).
        allowed = (self.open_access and info is not None) if owner is None else owner == subject
        if allowed:
            self._remember(thread, subject)
        return allowed

    async def claim(self, thread: str, subject: str) -> bool:
        """Make ``subject`` the owner of a new ``thread``; whether ``subject`` may write to it."""
        if (thread, subject) in self._known:
            return True
        info, owner = await self._record_and_owner(thread)
        if owner is None:
            if info is not None:
                # Made outside the API: nobody may claim it, only reach it without authentication.
                allowed = self.open_access
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
