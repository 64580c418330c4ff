"""The worker's step sender: notes a thread-to-thread message on the target's head before sending it.

Reports to a parent, messages to a child, close notices and compaction requests are *synthetic* inputs a
step sends to a thread. Between that send and the target's next commit, nothing stored says that the
target has work coming, so a reader of the store could take the thread tree for idle. :class:`InboxSender`
closes that gap: before each synthetic send it records the message's logical id in the target's
``inbox`` (:meth:`~stepagent.stores.dynamodb.conversation.DynamoConversationStore.note_inbound`), and the target's
commit that processes the id removes it. Tool results and user text are not noted: an open call (the
sender's turn flag) already says a result is expected. One extra ``TransactWriteItems`` per synthetic
message; a failure to note is a :class:`~stepagent.errors.StoreError` that fails the step like any other
transient error (the send has not happened yet, so the retry sends once).
"""

from __future__ import annotations

from stepagent.messages import InputMessage
from stepagent.senders.base import InputSender
from stepagent.stores.dynamodb import DynamoConversationStore


class InboxSender:
    """``InputSender`` that notes synthetic messages in the target's inbox, then sends with ``inner``."""

    def __init__(self, inner: InputSender, conversation: DynamoConversationStore) -> None:
        self.inner = inner
        self.conversation = conversation

    async def send(self, message: InputMessage, dedup_id: str) -> None:
        if message.synthetic is not None:
            await self.conversation.note_inbound(message.group_id, message.id or dedup_id)
        await self.inner.send(message, dedup_id)
