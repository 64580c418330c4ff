"""Deterministic identifiers.

Every id the runtime mints is derived from stable inputs (thread id, logical message id, tool call id), so a
re-run of the same step after a crash produces byte-identical history and idempotent side effects
(the same child thread, the same dedup ids). Nothing is derived from time or randomness.
"""

from __future__ import annotations

import uuid

_NAMESPACE = uuid.UUID("5d0c6c52-7a3e-4c55-9d0f-2b1f3c7e8a41")


def derived_id(*parts: str) -> str:
    """A UUID (string form) that depends only on ``parts``."""
    return str(uuid.uuid5(_NAMESPACE, "\x1f".join(parts)))


def child_thread_id(parent_id: str, spawn_tool_call_id: str) -> str:
    """The id of the child spawned by ``spawn_tool_call_id`` in ``parent_id``."""
    return derived_id("child", parent_id, spawn_tool_call_id)


def completion_id(thread_id: str, message_id: str, counter: int) -> str:
    """The row id of the ``counter``-th streamed item of a step whose last ready input is ``message_id``."""
    return f"{thread_id}-{message_id}-completion-{counter}"


def fresh_tool_call_id(thread_id: str, row_id: str, attempt: int = 0) -> str:
    """The id given to a model's tool call whose own id is empty or already used in the thread: derived
    from the call's row id, so a re-run of the step names it the same. ``call_`` and hex only, which
    every provider accepts back."""
    digest = derived_id("tool-call", thread_id, row_id, str(attempt)).replace("-", "")
    return f"call_{digest[:24]}"
