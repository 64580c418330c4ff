"""Putting the items of one poll of a thread tree in the order things happened across threads.

A poll reads each thread's new rows in turn (root first), so a child's lines would all follow the
parent's — its report after the parent already thanked it. Rows carry no clock across threads, but a
parent's ``event`` row (a child's report, its shutdown) was caused by a child's ``report_to_parent`` or
``close_thread`` call: :func:`interleave` emits each child's pending items up to such a call just before
the parent's next ``event``, and the rest after the parent's items. Each thread's own items keep their
order; nothing is dropped or repeated.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from stepagent import texts
from stepagent.transcript import Item

#: The calls of a child that reach its parent as an ``event`` row.
_TO_PARENT = ("report_to_parent", "close_thread")
#: How the parent's event for a child's shutdown starts (with or without a report): it names the child.
_CLOSED = texts.CLOSED


def interleave(items: list[Item], parents: Mapping[str, str | None], root: str) -> list[Item]:
    """``items`` (grouped by thread, as a poll reads them) in causal order; ``parents``: each thread's
    parent (threads with no known parent keep their place after the tree)."""
    queues: dict[str, deque[Item]] = {}
    for item in items:
        queues.setdefault(str(item.get("thread_id")), deque()).append(item)
    if len(queues) < 2:
        return items
    children: dict[str, list[str]] = {}
    for thread in queues:
        parent = parents.get(thread)
        if parent is not None and thread != root:
            children.setdefault(parent, []).append(thread)
    out: list[Item] = []

    def drain(thread: str, *, until: tuple[str, ...] = ()) -> None:
        queue = queues.get(thread)
        while queue:
            item = queue[0]
            if item.get("kind") == "event":
                text = str(item.get("text", ""))
                closed = [c for c in children.get(thread, []) if text.startswith(_CLOSED.format(thread=c))]
                for child in closed or children.get(thread, []):
                    drain(child, until=("close_thread",) if closed else _TO_PARENT)
            out.append(queue.popleft())
            if until and item.get("kind") == "tool_call" and item.get("name") in until:
                return
        if not until:
            for child in children.get(thread, []):
                drain(child)

    drain(root)
    for thread, queue in queues.items():  # threads outside the known tree, and anything left
        if queue:
            drain(thread)
    return out
