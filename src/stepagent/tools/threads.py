"""Built-in threading tools: ``spawn_thread`` (synchronous), ``report_to_parent``, ``close_thread`` and
``send_message_to_child`` (asynchronous).

Closing a thread also ends its subscriptions (tool servers told, best effort). Every message they send
uses the calling tool call id as its dedup id; senders scope dedup ids to the
target thread, so the report to the parent and the acknowledgement to the caller (same id, different
threads) never collide, and a re-run of the dispatch after a crash is absorbed. Child ids are derived from
(parent, spawn call id), so re-running a spawn finds the same child.
"""

from __future__ import annotations

import logging
from typing import Any

from stepagent import texts
from stepagent.errors import ToolError
from stepagent.history_items import Summary
from stepagent.ids import child_thread_id
from stepagent.messages import (
    CompactionComplete,
    InputMessage,
    ParentMessage,
    ThreadReport,
    ToolResult,
)
from stepagent.stores.base import ThreadInfo, ThreadKind
from stepagent.tools.base import Tool, ToolContext, send_tool_error

log = logging.getLogger(__name__)


def _string(arguments: dict[str, Any], name: str) -> str | None:
    value = arguments.get(name)
    return value if isinstance(value, str) else None


class SpawnThread(Tool):
    """Built-in ``spawn_thread``: creates a child thread for a task and seeds it; ``child_of`` must be the
    caller's thread stack."""

    name = "spawn_thread"
    builtin = True
    wait = "child"  # the thread then waits for the child's report
    description = (
        "Start a child thread on a sub-task. It sees this conversation and its task. Returns its ID."
    )
    parameters = {
        "type": "object",
        "properties": {
            "instructions": {
                "type": "string",
                "description": "The child's task, and what you will do meanwhile.",
            },
            "child_of": {
                "type": "array",
                "items": {"type": "string"},
                "description": 'Thread IDs from the root to the current thread, e.g. ["R"] or ["R", "A"].',
            },
        },
        "required": ["instructions", "child_of"],
    }
    inline = True
    referenced_later = True

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        raw_stack = arguments.get("child_of")
        given = [s for s in raw_stack if isinstance(s, str)] if isinstance(raw_stack, list) else []
        if given != context.thread_stack:
            text = texts.SPAWN_STACK_MISMATCH.format(
                given=texts.rust_debug_list(given),
                actual=texts.rust_debug_list(context.thread_stack),
                thread=context.thread_id,
            )
            return ToolResult.text(context.tool_call_id, text, call_id=context.call_id)
        instructions = _string(arguments, "instructions")
        if instructions is None:
            raise ToolError("instructions is required")
        child = child_thread_id(context.thread_id, context.tool_call_id)
        await context.access.spawn_thread(
            context.thread_id, child_id=child, spawn_tool_call_id=context.tool_call_id, kind=ThreadKind.CHILD
        )
        seed = ToolResult.text(
            context.tool_call_id,
            texts.CHILD_SEED.format(child=child, instructions=instructions),
            call_id=context.call_id,
        )
        await context.sender.send(InputMessage.tool_result(child, seed), context.tool_call_id)
        return ToolResult.text(
            context.tool_call_id, texts.SPAWN_OK.format(child=child), call_id=context.call_id
        )


async def _own_record(context: ToolContext) -> ThreadInfo | None:
    info = await context.access.get_thread(context.thread_id)
    return info if info is not None and info.parent_id is not None else None


def _report_message(parent: str, info: ThreadInfo, text: str) -> InputMessage:
    return InputMessage(
        content=ToolResult.text("", text),
        group_id=parent,
        synthetic=ThreadReport(tool_call_id=info.spawn_tool_call_id or "", child_thread_id=info.thread_id),
    )


class ReportToParent(Tool):
    """Built-in ``report_to_parent``: sends a report to the parent thread (a root has none)."""

    name = "report_to_parent"
    builtin = True
    description = "Send results or updates to the parent thread; you can keep working."
    parameters = {
        "type": "object",
        "properties": {"report": {"type": "string", "description": "The report."}},
        "required": ["report"],
    }

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        report = _string(arguments, "report")
        if report is None:
            await send_tool_error(context, "report is required")
            return
        info = await _own_record(context)
        if info is None or info.parent_id is None:
            await send_tool_error(context, "No parent thread found — this is a root thread")
            return
        template = (
            texts.REPORT_FROM_EVENT_CHILD if info.kind == ThreadKind.SUBSCRIPTION_EVENT else texts.REPORT
        )
        message = _report_message(info.parent_id, info, template.format(report=report))
        await context.sender.send(message, context.tool_call_id)
        await context.send_result(texts.REPORT_ACK)


class CloseThread(Tool):
    """Built-in ``close_thread``: closes the calling child thread, ends its subscriptions and tells the parent
    (a compaction child hands over its summary)."""

    name = "close_thread"
    builtin = True
    description = (
        "Close your own thread for good. Cancel your subscriptions first. Put anything not yet reported in "
        "report_to_parent; omit it if there is nothing."
    )
    parameters = {
        "type": "object",
        "properties": {
            "thread_id": {"type": "string", "description": "Your own thread ID."},
            "report_to_parent": {"type": "string", "description": "Optional final report."},
        },
        "required": ["thread_id"],
    }

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        thread_id = _string(arguments, "thread_id")
        if not thread_id:
            await send_tool_error(context, "thread_id is required")
            return
        if thread_id != context.thread_id:
            await send_tool_error(
                context,
                f"the provided thread ID to close {thread_id} does not match the current thread ID "
                f"{context.thread_id}",
            )
            return
        info = await _own_record(context)
        if info is None or info.parent_id is None:
            await send_tool_error(context, "cannot close the root thread. Only child threads can be closed.")
            return
        report = _string(arguments, "report_to_parent")
        # Close first: from here on every input to this thread is dropped, so nothing races the report.
        await context.access.close_thread(thread_id)
        await _end_subscriptions(context, thread_id)
        if info.kind == ThreadKind.COMPACTION:
            if report:
                summary = Summary(text=report, up_to_order=info.spawn_order or 0)
                await context.access.save_summary(info.parent_id, summary)
            done = InputMessage(
                content=ToolResult.text("", texts.COMPACTION_COMPLETE),
                group_id=info.parent_id,
                synthetic=CompactionComplete(),
            )
            await context.sender.send(done, context.tool_call_id)
        else:
            text = self._closing_text(info, report)
            if text is not None:
                await context.sender.send(_report_message(info.parent_id, info, text), context.tool_call_id)
        if context.notifier is not None:
            try:
                await context.notifier.thread_closed(thread_id)
            except Exception:  # best effort by contract: tool servers may be gone
                log.warning("could not notify tool servers that thread %s closed", thread_id, exc_info=True)

    @staticmethod
    def _closing_text(info: ThreadInfo, report: str | None) -> str | None:
        if info.kind == ThreadKind.SUBSCRIPTION_EVENT:
            if not report:
                return None  # an event child that has nothing to say closes silently
            return texts.EVENT_CHILD_CLOSED.format(
                subscription=info.spawn_tool_call_id, thread=info.thread_id, report=report
            )
        if report:
            return texts.CLOSED_WITH_REPORT.format(thread=info.thread_id, report=report)
        return texts.CLOSED.format(thread=info.thread_id)


async def _end_subscriptions(context: ToolContext, thread_id: str) -> None:
    """A closed thread has no subscriptions: "a thread is active while it has subscriptions" must not keep
    it alive. Tool servers are told, best effort, as for an interrupted call. Idempotent (a re-dispatch
    after a crash finds fewer or none)."""
    for subscription in sorted(await context.access.active_subscriptions(thread_id)):
        if context.notifier is not None:
            try:
                await context.notifier.cancel_tool_call(thread_id, subscription)
            except Exception:  # best effort by contract: the subscription ends here regardless
                log.warning("could not tell the tool server that subscription %s ended", subscription)
        await context.access.remove_subscription(thread_id, subscription)


class SendMessageToChild(Tool):
    """Built-in ``send_message_to_child``: sends a message, inlined into the history of one of the caller's
    children."""

    name = "send_message_to_child"
    builtin = True
    description = "Send a message into a child thread's conversation."
    parameters = {
        "type": "object",
        "properties": {
            "thread_id": {"type": "string", "description": "The child's thread ID."},
            "message": {"type": "string", "description": "The message."},
        },
        "required": ["thread_id", "message"],
    }

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        child = _string(arguments, "thread_id")
        if not child:
            await send_tool_error(context, "thread_id is required")
            return
        message = _string(arguments, "message")
        if message is None:
            await send_tool_error(context, "message is required")
            return
        info = await context.access.get_thread(child)
        if info is None or info.parent_id is None:
            await send_tool_error(context, "Child thread not found or has no parent")
            return
        if info.parent_id != context.thread_id:
            await send_tool_error(
                context, f"thread {child} is not a child of the current thread {context.thread_id}"
            )
            return
        outgoing = InputMessage(
            content=ToolResult.text("", texts.PARENT_MESSAGE.format(message=message)),
            group_id=child,
            synthetic=ParentMessage(tool_call_id=info.spawn_tool_call_id or ""),
        )
        await context.sender.send(outgoing, context.tool_call_id)
        await context.send_result(texts.PARENT_MESSAGE_ACK)
