"""Subscriptions, closing threads and synthetic inputs through the worker on moto: an event that overtakes
its subscription's start result is held, ``cancel_subscription`` answers the same after a crash, closing a
thread ends its subscriptions, and a forged or unknown synthetic input is refused with an ``error`` event
naming why."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stepagent import texts
from stepagent.errors import StoreError
from stepagent.history_items import ToolCallItem, ToolResultItem
from stepagent.messages import (
    CompactionComplete,
    InputMessage,
    ParentMessage,
    SubscriptionEvent,
    ThreadReport,
    ToolResult,
)
from stepagent.providers.base import ModelInfo, ModelRequest, StreamEvent, ToolCallComplete
from stepagent.providers.scripted import ScriptedProvider
from stepagent.stores.base import ThreadKind
from stepagent.tools.base import Tool, ToolContext
from tests.integration.aws_helpers import SCRIPT, TOOLS, Stack, aws_stack, failed_ids

pytestmark = pytest.mark.asyncio

SUB = "sub-1"  # every subscribe call gets this id (see SubscriptionIds)


def tid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class SubscriptionIds:
    """The scripted model; its ``subscribe`` calls carry the id :data:`SUB`, so a script can cancel it."""

    def __init__(self, script: dict[str, Any]) -> None:
        self.inner = ScriptedProvider(script)

    @property
    def info(self) -> ModelInfo:
        return self.inner.info

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        async for event in self.inner.stream(request):
            if isinstance(event, ToolCallComplete) and event.call.name == "subscribe":
                event = ToolCallComplete(event.call.model_copy(update={"id": SUB}))
            yield event


class Subscribe(Tool):
    """A subscription server stand-in. ``early_event``: it sends a non-associative event before the
    subscription's start result (a server whose event overtakes its own acknowledgement)."""

    name = "subscribe"
    description = "Subscribe to deploys."
    parameters = {"type": "object", "properties": {}}

    def __init__(self, *, early_event: str | None = None) -> None:
        self.early_event = early_event

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        call = context.tool_call_id
        if self.early_event is not None:
            event = InputMessage.tool_result(
                context.thread_id,
                ToolResult.text(call, self.early_event),
                synthetic=SubscriptionEvent(tool_call_id=call, associative=False),
            )
            await context.sender.send(event, f"{call}-event-0")
        started = ToolResult.text(call, "subscribed to deploys")
        await context.sender.send(
            InputMessage.tool_result(context.thread_id, started, subscription=True), call
        )


WATCH = {"when": "watch", "on": ["user"], "reply": [{"tool_call": {"name": "subscribe", "arguments": {}}}]}
WATCHING = {"when": "^subscribed to deploys", "on": ["tool_result"], "reply": [{"text": "Watching."}]}


def script(*rules: dict[str, Any]) -> dict[str, Any]:
    return {**SCRIPT, "rules": [*rules, *SCRIPT["rules"]]}


async def rows(stack: Stack, thread: str) -> list[Any]:
    return [row.item async for row in stack.runtime.conversation.load_rows(thread)]


# ---- item 3 ----------------------------------------------------------------------------------------------


async def test_a_non_associative_event_that_overtakes_its_start_result_is_held_then_handled() -> None:
    handle = {
        "when": "^deploy finished",
        "on": ["tool_result"],
        "reply": [
            {
                "tool_call": {
                    "name": "close_thread",
                    "arguments": {"thread_id": "{thread_id}", "report_to_parent": "deploy ok"},
                }
            }
        ],
    }
    noted = {"when": "deploy ok", "on": ["event"], "reply": [{"text": "Noted."}]}
    tools = [*TOOLS, Subscribe(early_event="deploy finished")]
    async with aws_stack(script=script(handle, noted, WATCH, WATCHING), tools=tools) as stack:
        thread = tid("early")
        await stack.send_user(thread, "watch the deploys", "m1")
        await stack.pump()
        [child] = await stack.runtime.conversation.children(thread)
        assert child.kind == ThreadKind.SUBSCRIPTION_EVENT and child.closed
        assert "deploy finished" in await stack.texts(child.thread_id)
        assert (await stack.texts(thread))[-1] == "Noted."
        assert not [e for e in await stack.outputs() if e["type"] == "error"]


# ---- item 4 ----------------------------------------------------------------------------------------------


class FailsTheCancelResultOnce:
    """The commit holding ``cancel_subscription``'s result fails once (the process dies there): the
    subscription is gone only if the tool removed it before the commit."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.failed = inner, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def commit(self, thread_id: str, commit: Any) -> Any:
        holds_result = any(message_id.endswith("-sync-result") for _, message_id in commit.rows)
        if holds_result and not self.failed:
            self.failed = True
            raise StoreError("injected: crash before the cancel's result was committed")
        return await self.inner.commit(thread_id, commit)


async def test_cancel_subscription_answers_the_same_when_re_run_after_a_crash() -> None:
    cancel = {
        "when": "stop watching",
        "on": ["user"],
        "reply": [{"tool_call": {"name": "cancel_subscription", "arguments": {"tool_call_id": SUB}}}],
    }
    stopped = {"when": "cancelled successfully", "reply": [{"text": "Stopped."}]}
    provider = SubscriptionIds(script(cancel, stopped, WATCH, WATCHING))
    async with aws_stack(provider=provider, tools=[*TOOLS, Subscribe()]) as stack:
        thread = tid("cancel")
        await stack.send_user(thread, "watch the deploys", "m1")
        await stack.pump()
        assert await stack.runtime.state.active_subscriptions(thread) == {SUB}
        wrapper = FailsTheCancelResultOnce(stack.runtime.system.conversation)
        stack.runtime.system.conversation = wrapper
        await stack.send_user(thread, "stop watching", "m2")
        await stack.pump()
        assert wrapper.failed  # the first run crashed; the redelivery re-ran the tool
        results = [i.result.first_text() for i in await rows(stack, thread) if isinstance(i, ToolResultItem)]
        assert results[-1] == texts.SUBSCRIPTION_CANCELLED.format(id=SUB)
        assert (await stack.texts(thread))[-1] == "Stopped."
        assert await stack.runtime.state.active_subscriptions(thread) == set()


# ---- item 5 ----------------------------------------------------------------------------------------------


class RecordingNotifier:
    def __init__(self) -> None:
        self.cancelled: list[tuple[str, str]] = []
        self.closed: list[str] = []

    async def cancel_tool_call(self, thread_id: str, tool_call_id: str) -> None:
        self.cancelled.append((thread_id, tool_call_id))

    async def thread_closed(self, thread_id: str) -> None:
        self.closed.append(thread_id)


async def test_closing_a_thread_ends_its_subscriptions_and_tells_the_tool_servers() -> None:
    child_watches = {
        "when": "You are now INSIDE",
        "reply": [{"tool_call": {"name": "subscribe", "arguments": {}}}],
    }
    child_closes = {
        "when": "^subscribed to deploys",
        "on": ["tool_result"],
        "reply": [{"tool_call": {"name": "close_thread", "arguments": {"thread_id": "{thread_id}"}}}],
    }
    provider = SubscriptionIds(script(child_watches, child_closes))
    async with aws_stack(provider=provider, tools=[*TOOLS, Subscribe()]) as stack:
        notifier = RecordingNotifier()
        stack.runtime.system.config.notifier = notifier
        parent = tid("parent")
        await stack.send_user(parent, "please delegate", "m1")
        await stack.pump()
        [child] = await stack.runtime.conversation.children(parent)
        assert child.closed
        assert await stack.runtime.state.active_subscriptions(child.thread_id) == set()
        assert notifier.cancelled == [(child.thread_id, SUB)] and notifier.closed == [child.thread_id]


# ---- item 9 ----------------------------------------------------------------------------------------------


async def test_forged_or_unknown_synthetic_inputs_are_refused_with_an_error_event() -> None:
    async with aws_stack() as stack:
        root = tid("root")
        await stack.send_user(root, "please delegate", "m1")
        await stack.pump()
        [spawn] = [
            i.call.id
            for i in await rows(stack, root)
            if isinstance(i, ToolCallItem) and i.call.name == "spawn_thread"
        ]
        before = await stack.history(root)
        await stack.outputs()

        def synthetic(kind: Any, text: str = "forged", call: str = "x") -> InputMessage:
            return InputMessage.tool_result(root, ToolResult.text(call, text), synthetic=kind)

        forged = {
            "not-a-child": synthetic(ThreadReport(tool_call_id=spawn, child_thread_id="intruder")),
            "unknown-call": synthetic(ThreadReport(tool_call_id="nope", child_thread_id="intruder")),
            "to-a-root": synthetic(ParentMessage(tool_call_id="nope")),
            "nothing-to-apply": synthetic(CompactionComplete()),
            "unknown-subscription": synthetic(SubscriptionEvent(tool_call_id="ghost", associative=True)),
        }
        reasons = {
            "not-a-child": "intruder, which is not a child",
            "unknown-call": "tool call nope, which is not in this thread",
            "to-a-root": "parent_message for tool call nope",
            "nothing-to-apply": "no summary to apply",
            "unknown-subscription": "ghost, which is not an active subscription",
        }
        for name, message in forged.items():
            await stack.runtime.sender.send(message, name)
        await stack.pump()
        assert all(failed_ids(result) == [] for _, _, result in stack.handled)
        assert await stack.history(root) == before  # none of them changed anything
        errors = {
            e["message"].split()[3].rstrip(":"): e for e in await stack.outputs() if e["type"] == "error"
        }
        assert sorted(errors) == sorted(forged)
        for name, reason in reasons.items():
            assert errors[name]["retrying"] is False and reason in errors[name]["message"], errors[name]
