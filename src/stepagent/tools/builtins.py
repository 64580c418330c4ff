"""The built-in tool list, in the order the model is told about them."""

from __future__ import annotations

from stepagent.tools.base import Tool
from stepagent.tools.subscriptions import CancelSubscription, SleepUntilEventOrInput
from stepagent.tools.threads import CloseThread, ReportToParent, SendMessageToChild, SpawnThread


def builtin_tools() -> list[Tool]:
    return [
        SpawnThread(),
        ReportToParent(),
        CloseThread(),
        SendMessageToChild(),
        CancelSubscription(),
        SleepUntilEventOrInput(),
    ]
