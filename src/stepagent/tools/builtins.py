"""The built-in tools: their list (in the order the model is told about them), their names and groups.

``STEPAGENT_BUILTIN_TOOLS`` (:func:`stepagent.agent_config.parse_builtin_tools`) selects among
:data:`BUILTIN_TOOL_NAMES` by name or by group (:data:`BUILTIN_GROUPS`). :data:`CHILD_TOOLS` are offered
in every child thread whatever the selection, because a child (a spawned, subscription-event or
compaction thread) must be able to report to its parent and close itself.
"""

from __future__ import annotations

from stepagent.tools.base import Tool
from stepagent.tools.sleep import Sleep, SleepUntil
from stepagent.tools.subscriptions import CancelSubscription, SleepUntilEventOrInput
from stepagent.tools.threads import CloseThread, ReportToParent, SendMessageToChild, SpawnThread

#: Built-in tool names by group, in the order the model is told about them.
BUILTIN_GROUPS: dict[str, tuple[str, ...]] = {
    "threads": (SpawnThread.name, ReportToParent.name, CloseThread.name, SendMessageToChild.name),
    "subscriptions": (CancelSubscription.name, SleepUntilEventOrInput.name),
    "timers": (Sleep.name, SleepUntil.name),
}
BUILTIN_TOOL_NAMES: tuple[str, ...] = tuple(name for names in BUILTIN_GROUPS.values() for name in names)
#: Offered in every child thread, even when the threading tools are not selected.
CHILD_TOOLS: frozenset[str] = frozenset({ReportToParent.name, CloseThread.name})


def builtin_tools() -> list[Tool]:
    """The built-ins that need nothing but the step (the timers, ``sleep``/``sleep_until``, need a
    clock and a timer backend: :mod:`stepagent.tools.sleep`)."""
    return [
        SpawnThread(),
        ReportToParent(),
        CloseThread(),
        SendMessageToChild(),
        CancelSubscription(),
        SleepUntilEventOrInput(),
    ]
