"""The built-in tools: their list (in the order the model is told about them), their names and groups.

``STEPAGENT_BUILTIN_TOOLS`` (:func:`parse_builtin_tools`) selects among
:data:`BUILTIN_TOOL_NAMES` by name or by group (:data:`BUILTIN_GROUPS`). :data:`CHILD_TOOLS` are offered
in every child thread whatever the selection, because a child (a spawned, subscription-event or
compaction thread) must be able to report to its parent and close itself.
"""

from __future__ import annotations

from collections.abc import Iterable

from stepagent.errors import ConfigurationError
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
ALL_BUILTINS: frozenset[str] = frozenset(BUILTIN_TOOL_NAMES)
BUILTIN_TOOLS_SETTING = "STEPAGENT_BUILTIN_TOOLS"


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


def parse_builtin_tools(spec: str | Iterable[str], *, setting: str = BUILTIN_TOOLS_SETTING) -> frozenset[str]:
    """The built-in tools selected by ``spec``: a comma-separated list (or an iterable) of ``all``,
    ``none``, group names (``threads``, ``subscriptions``, ``timers``) and tool names, applied left to
    right; ``-name`` removes a tool or group (a list that starts with a removal starts from ``all``).

    ``all`` · ``none`` · ``threads,timers`` · ``all,-timers`` · ``-send_message_to_child`` ·
    ``spawn_thread,report_to_parent,close_thread``. An empty string is an error; an empty collection
    selects none."""
    tokens = [t.strip().lower() for t in (spec.split(",") if isinstance(spec, str) else spec)]
    tokens = [t for t in tokens if t]
    if not tokens:
        if not isinstance(spec, str):
            return frozenset()  # an empty collection selects none
        raise ConfigurationError(f"{setting} is empty: use 'all', 'none' or a comma-separated list")
    selected: set[str] = set(ALL_BUILTINS) if tokens[0].startswith("-") else set()
    unknown: list[str] = []
    for token in tokens:
        remove = token.startswith("-")
        names = _builtin_names(token.removeprefix("-").strip())
        if names is None:
            unknown.append(token)
        elif remove:
            selected.difference_update(names)
        else:
            selected.update(names)
    if unknown:
        valid = ", ".join(["all", "none", *BUILTIN_GROUPS, *BUILTIN_TOOL_NAMES])
        raise ConfigurationError(
            f"{setting} has unknown {'entry' if len(unknown) == 1 else 'entries'} "
            f"{', '.join(map(repr, unknown))}; valid: {valid} (prefix '-' to remove)"
        )
    return frozenset(selected)


def _builtin_names(token: str) -> Iterable[str] | None:
    if token == "all":
        return BUILTIN_TOOL_NAMES
    if token == "none":
        return ()
    if token in BUILTIN_GROUPS:
        return BUILTIN_GROUPS[token]
    if token in BUILTIN_TOOL_NAMES:
        return (token,)
    return None
