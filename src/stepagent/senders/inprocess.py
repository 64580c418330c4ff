"""An in-process input queue: what step mode uses in tests and what local mode builds on.

Messages are kept in FIFO order with their logical ids. Like an SQS FIFO queue with deduplication, a
second send of the same ``(group_id, dedup_id)`` is dropped; the receiving thread's own dedup (by logical
message id) covers duplicates that arrive anyway. Each message keeps the trace context it was sent in, as
the SQS sender's ``traceparent`` attribute does.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from stepagent.messages import InputMessage
from stepagent.tracing import current_traceparent


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """A message on the in-process queue with its logical message id and the sender's trace context."""

    message: InputMessage
    message_id: str
    traceparent: str | None = None


@dataclass(slots=True)
class InProcessSender:
    """``InputSender`` that appends to an in-memory queue."""

    dedupe: bool = True
    queue: list[QueuedMessage] = field(default_factory=list)
    sent: list[QueuedMessage] = field(default_factory=list)
    _seen: set[tuple[str, str]] = field(default_factory=set)
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    async def send(self, message: InputMessage, dedup_id: str) -> None:
        key = (message.group_id, dedup_id)
        if self.dedupe and key in self._seen:
            return
        self._seen.add(key)
        logical = message if message.id is not None else message.model_copy(update={"id": dedup_id})
        queued = QueuedMessage(logical, logical.id or dedup_id, current_traceparent())
        self.queue.append(queued)
        self.sent.append(queued)
        self._wakeup.set()

    def drain(self) -> list[QueuedMessage]:
        """Take everything queued, in send order."""
        queued, self.queue = self.queue, []
        self._wakeup.clear()
        return queued

    async def wait(self) -> None:
        await self._wakeup.wait()
