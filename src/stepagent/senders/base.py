"""The input-sender port: put an ``InputMessage`` on a thread's input queue.

``dedup_id`` is a deterministic logical id (never a timestamp). Implementations scope it to the target
thread (``message.group_id``), so two sends with the same logical id to different threads never collide,
and carry it as the message's logical id so the receiving thread's dedup recognises a re-send.
"""

from __future__ import annotations

from typing import Protocol

from stepagent.messages import InputMessage


class InputSender(Protocol):
    """Puts a message on its thread's input queue; ``dedup_id`` is its deterministic logical id."""

    async def send(self, message: InputMessage, dedup_id: str) -> None: ...
