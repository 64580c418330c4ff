"""How long the provider's prompt cache keeps what a step's requests write: five minutes or one hour.

A one-hour entry costs more to write (Anthropic: 2x the input price instead of 1.25x) but survives a wait
that a five-minute entry does not, after which the whole context would be written again. The setting
(``STEPAGENT_PROMPT_CACHE_TTL``) is ``5m``, ``1h`` or ``auto``; :func:`choose_ttl` applies it.

``auto`` has to decide before the model answers, so it predicts from the thread itself: a step writes
one-hour entries when it resumes the thread from a slow wait — the result of a RAP call, a timer's
wake-up, a child's report, an approval — or when the thread's latest tool call was of a slow kind (a RAP
tool, a sleep, a spawn), since a thread that waits on something slow is the kind that waits again (an
agent driving long-running tools, sleeping between checks, or supervising children), and the user's own
next message tends to come as slowly. Every other step (a conversation with fast tools or none) writes
five-minute entries, the cheapest when the next request follows soon.

The end of a turn is a wait too — for a person. Each thread's head keeps when its last turn ended and how
long its person then took to write (measured by the step that folds the person's next message in), so
``auto`` also writes one-hour entries in a thread whose person took longer than
:data:`SLOW_PERSON_SECONDS` the last time (:func:`is_slow_person`): a five-minute entry would be gone when
they answer, and the whole context written again, where the one-hour entry costs 0.75x more only on what the
step writes. A person who answers within a minute keeps five-minute entries.

:func:`is_slow_wait` is the one place that says which waits are slow, over *wait kinds* (strings):
``"rap"``, ``"sleep"``, ``"child"`` and ``"approval"`` are; ``"tool"`` (a dispatched function),
``"user"`` and ``"event"`` are not. :func:`input_wait_kinds` names what a step's inputs ended; a new kind
of wait plugs in by producing its kind there (or through ``Tool.wait``) and, if slow, listing it in
:data:`SLOW_WAITS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from stepagent.core.history import HistoryManager
from stepagent.history_items import HistoryItem, ToolCallItem
from stepagent.messages import (
    ApprovalDecision,
    CompactionComplete,
    InputMessage,
    ParentMessage,
    SubscriptionEvent,
    ThreadReport,
    ToolResult,
)
from stepagent.providers.base import CacheTtl
from stepagent.tools.base import Toolset

#: Waits that usually outlast a five-minute cache entry.
SLOW_WAITS = frozenset({"rap", "sleep", "child", "approval"})


#: A person who took longer than this to answer (seconds) is expected to outlast a five-minute entry next
#: time (with a minute of margin: the entry was written while the model answered, before the turn ended).
SLOW_PERSON_SECONDS = 240.0


def is_slow_person(gap: float | None) -> bool:
    """Whether a person whose last answer came ``gap`` seconds after the turn ended (``None``: not known
    yet) is expected to outlast a five-minute cache entry with their next one."""
    return gap is not None and gap > SLOW_PERSON_SECONDS


def is_slow_wait(kinds: Iterable[str]) -> bool:
    """Whether waiting on any of ``kinds`` is expected to outlast a five-minute cache entry."""
    return any(kind in SLOW_WAITS for kind in kinds)


def choose_ttl(setting: str, *, slow: bool) -> CacheTtl:
    """The TTL of a step's requests: the fixed ``5m``/``1h``, or for ``auto`` one hour when the step
    resumes from a slow wait (``slow``), else five minutes."""
    if setting == "1h" or (setting == "auto" and slow):
        return "1h"
    return "5m"


def input_wait_kinds(
    inputs: Iterable[InputMessage], pending_calls: dict[str, str], toolset: Toolset
) -> set[str]:
    """The kinds of wait that ``inputs`` end. ``pending_calls`` maps the thread's open tool call ids to
    their tool names (what a tool result answers)."""
    kinds: set[str] = set()
    for message in inputs:
        synthetic = message.synthetic
        content = message.content
        if isinstance(synthetic, ThreadReport | ParentMessage):
            kinds.add("child")
        elif isinstance(synthetic, SubscriptionEvent):
            kinds.add("event")
        elif isinstance(synthetic, CompactionComplete):
            kinds.add("child")  # a compaction child's summary: the thread waited for another model call
        elif isinstance(content, ApprovalDecision):
            kinds.add("approval")  # a person's decision on a waiting call: people answer slowly
        elif synthetic is None and isinstance(content, ToolResult):
            name = pending_calls.get(content.id)
            tool = toolset.get(name) if name is not None else None
            kinds.add(tool.wait if tool is not None else "tool")
        elif message.is_user_text:
            kinds.add("user")
    return kinds


def latest_call_kind(history: Sequence[HistoryItem], toolset: Toolset) -> str | None:
    """The wait kind of the thread's latest tool call (``None`` when its history shows none)."""
    for item in reversed(history):
        if isinstance(item, ToolCallItem):
            if item.needs_approval:
                return "approval"
            tool = toolset.get(item.call.name)
            return tool.wait if tool is not None else "tool"
    return None


def resumes_slowly(
    history: HistoryManager,
    messages: Sequence[InputMessage],
    toolset: Toolset,
    clock: Callable[[], float],
) -> bool:
    """Whether a step with ``messages`` resumes the thread from a slow wait (what they end, or the kind of
    the thread's latest call), or its person is a slow one (:func:`person_gap`)."""
    pending = history.pending_tool_call()
    open_calls = {} if pending is None else {pending.call.id: pending.call.name}
    kinds = input_wait_kinds(messages, open_calls, toolset)
    latest = latest_call_kind(history.history, toolset)
    slow = is_slow_wait(kinds if latest is None else {*kinds, latest})
    return slow or is_slow_person(person_gap(history, messages, clock))


def person_gap(
    history: HistoryManager, messages: Sequence[InputMessage], clock: Callable[[], float]
) -> float | None:
    """How long the thread's person took to write after its last turn: measured now when a message of
    theirs ends a finished turn (and recorded on the head with the step's commit), else the thread's last
    measure. The end of every turn then records its time (``HistoryManager.clock``)."""
    history.clock = clock
    info = history.info
    if info is None:
        return None
    person = any(m.is_user_text and m.synthetic is None for m in messages)
    if person and info.turn_complete and info.turn_ended_at is not None:
        history.person_gap = max(0.0, clock() - info.turn_ended_at)
        return history.person_gap
    return info.person_gap
