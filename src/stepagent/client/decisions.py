"""What became of a person's decision on a waiting tool call, read from the items a client follows.

A decision (:meth:`stepagent.client.Client.approve`) is an input message; the runtime either applies it —
an ``approval`` row, or the call's result (``tool_result``/``event``) when it answers the call — or refuses
it with an ``error`` that names the decision's message id (the thread's notice) or carries the call's
``tool_call_id`` (a stored error event). :func:`decision_outcome` tells which an item shows, so the chat,
``stepagent approve`` and any other follower agree on it.
"""

from __future__ import annotations

from typing import Literal

from stepagent.transcript import Item

Outcome = Literal["accepted", "refused"]


def decision_outcome(item: Item, tool_call_id: str, message_id: str) -> Outcome | None:
    """``accepted`` or ``refused`` when ``item`` settles the decision ``message_id`` on ``tool_call_id``,
    else ``None`` (the item says nothing about it)."""
    kind = item.get("kind")
    if kind in ("approval", "tool_result", "event") and item.get("tool_call_id") == tool_call_id:
        return "accepted"
    if kind == "error" and (
        item.get("tool_call_id") == tool_call_id or (message_id and message_id in str(item.get("text", "")))
    ):
        return "refused"
    return None
