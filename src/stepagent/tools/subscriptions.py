"""Built-in ``cancel_subscription`` (synchronous) and ``sleep_until_event_or_input`` (asynchronous,
passive: it never answers, the next input interrupts it)."""

from __future__ import annotations

import logging
from typing import Any

from stepagent import texts
from stepagent.errors import ToolError
from stepagent.messages import ToolResult
from stepagent.tools.base import Tool, ToolContext

log = logging.getLogger(__name__)


class CancelSubscription(Tool):
    """Built-in ``cancel_subscription``: ends one of the thread's own subscriptions and tells its tool server
    (best effort)."""

    name = "cancel_subscription"
    builtin = True
    description = "Cancel a subscription this thread started; its tool server is told."
    parameters = {
        "type": "object",
        "properties": {
            "tool_call_id": {
                "type": "string",
                "description": "The tool call ID that started it.",
            }
        },
        "required": ["tool_call_id"],
    }
    inline = True

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        subscription = arguments.get("tool_call_id")
        if not isinstance(subscription, str) or not subscription:
            raise ToolError("tool_call_id is required")
        if subscription not in await context.access.active_subscriptions(context.thread_id):
            raise ToolError(f"no active subscription found for tool call ID '{subscription}'")
        if context.notifier is not None:
            try:
                await context.notifier.cancel_tool_call(context.thread_id, subscription)
            except Exception:  # best effort: the subscription is dropped from tracking regardless
                log.warning("could not notify the tool server of cancelled subscription %s", subscription)
        # Removed with the result's commit: a re-run after a crash still finds the subscription active and
        # answers as the first run did (removing it here would make the re-run say "no active subscription").
        if context.effects is not None:
            context.effects.subscriptions_removed.append(subscription)
        else:
            await context.access.remove_subscription(context.thread_id, subscription)
        text = texts.SUBSCRIPTION_CANCELLED.format(id=subscription)
        return ToolResult.text(context.tool_call_id, text, call_id=context.call_id)


class SleepUntilEventOrInput(Tool):
    """Built-in ``sleep_until_event_or_input``: never answered; the next input interrupts it."""

    name = "sleep_until_event_or_input"
    builtin = True
    description = (
        "Pause until an event or user input arrives: use it when every task is done and you are waiting "
        "(e.g. for a webhook or the user)."
    )
    passive = True
    answered = False  # the next input interrupts it; no result ever comes

    def display(self, arguments: dict[str, Any]) -> str:
        return "Sleeping until event or input"

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        return None
