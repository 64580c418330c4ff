"""When a step has finished the thread's turn: the rule behind ``Commit.turn_complete``.

A step completes the turn when it leaves the thread with nothing pending of its own: no unanswered call
that will bring a result (a *passive* call — a timer, ``sleep_until_event_or_input`` — does not count: the
agent is waiting, nothing runs), hence no input held back for such a call, and no compaction about to be
requested. A failed completion that is given up on also ends the turn: nothing more happens until the
next input. What other threads are doing (children, messages on their way) is not this thread's to say;
readers combine the flags of a thread tree (see :mod:`stepagent.client`).
"""

from __future__ import annotations

from stepagent.core.history import HistoryManager
from stepagent.tools.base import Toolset


def turn_is_complete(history: HistoryManager, toolset: Toolset, *, compaction_due: bool = False) -> bool:
    """Whether the step that is about to make its last commit leaves ``history`` with nothing pending."""
    if compaction_due:
        return False
    pending = history.pending_tool_call()
    if pending is None:
        return True  # deferred inputs exist only while a non-passive call is pending
    tool = toolset.get(pending.call.name)
    return tool is not None and tool.passive
