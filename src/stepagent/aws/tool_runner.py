"""Python function tools off the step: :class:`SqsFunctionRunner` (the worker's side) and
:func:`handle_tool_batch` (the tool runner Lambda's side).

Guarantees:

- Dispatch is one ``SendMessage`` to the standard tool queue with the body
  ``{"v": 1, "thread_id", "tool_call_id", "call_id", "tool_name", "arguments", "thread_stack", "user_id"}``
  (claim-checked if big). Standard queues have no deduplication id: idempotency is by tool call id.
- The runner invokes the :class:`~stepagent.tools.functions.FunctionTool` (its own timeout, capped by the
  Lambda's remaining time so a slow tool still gets an answer back) and sends the result — or
  ``Error: <message>`` for a :class:`~stepagent.errors.ToolError`, an unknown tool or a timeout — to the
  calling thread with dedup id = the tool call id. A re-delivered tool message re-runs the function, but
  the thread keeps one result (SQS FIFO dedup, then the thread's own answered-call dedup).
- With a tracer, each run is an ``execute_tool {name}`` span, the child of the dispatching step's span
  (the tool message's ``traceparent`` attribute), and the result message carries that trace on.
- What becomes an ``Error: ...`` result and what is retried follows :func:`~stepagent.errors.classify`
  (a :class:`~stepagent.errors.ToolError` is a result; anything else a tool raises fails that record
  alone). A record whose result could not be sent, whose tool failed that way, or whose body is
  unreadable is reported in ``batchItemFailures``: it is retried and ends in the tool DLQ, never silently
  dropped, and the batch's other records are answered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from stepagent.aws.lambda_events import BatchItemFailure, BatchResponse, SqsEvent, SqsRecord
from stepagent.aws.log_keys import append_keys
from stepagent.aws.metrics import DimensionedSink, publish_tool_latency
from stepagent.errors import MalformedMessageError, classify
from stepagent.formats import FORMAT_FIELD, FORMAT_VERSION, check_version
from stepagent.messages import InputMessage, ToolResult
from stepagent.senders.base import InputSender
from stepagent.senders.sqs import SqsQueues, SqsSender, record_format, record_traceparent
from stepagent.tools.base import ToolContext
from stepagent.tools.functions import Invocable
from stepagent.tracing import (
    Tracer,
    capture_content,
    continuing,
    tool_attributes,
    trace_attributes,
    traced,
)

if TYPE_CHECKING:
    from stepagent.tools.mcp_oauth import OAuthServices
    from stepagent.tools.mcp_runs import ReadKept

logger = logging.getLogger(__name__)

#: The tool message's own format version: the ``v`` every queued body carries (:mod:`stepagent.formats`).
TOOL_MESSAGE_VERSION = FORMAT_VERSION
#: Seconds kept back from the Lambda's remaining time to send the result after a tool times out.
TIME_MARGIN_S = 10.0


class SqsFunctionRunner:
    """``FunctionRunner`` that queues the call for the tool runner."""

    def __init__(self, queues: SqsQueues, tool_queue_url: str) -> None:
        self.queues = queues
        self.tool_queue_url = tool_queue_url

    async def submit(self, tool_name: str, arguments: dict[str, Any], context: ToolContext) -> None:
        call = ToolCallMessage(
            thread_id=context.thread_id,
            tool_call_id=context.tool_call_id,
            call_id=context.call_id,
            tool_name=tool_name,
            arguments=arguments,
            thread_stack=list(context.thread_stack),
            user_id=context.user_id,
            resume=context.resume,
        )
        await self.queues.send(self.tool_queue_url, call.to_json(), attributes=trace_attributes())


@dataclass(frozen=True, slots=True)
class ToolCallMessage:
    """A function tool call on the tool queue (wire version ``v`` = :data:`TOOL_MESSAGE_VERSION`)."""

    thread_id: str
    tool_call_id: str
    call_id: str | None
    tool_name: str
    arguments: dict[str, Any]
    thread_stack: list[str]
    user_id: str | None = None
    #: A call resumed with the person's answer to the tool's question (MCP elicitation).
    resume: dict[str, Any] | None = None

    def to_json(self) -> str:
        extra = {} if self.resume is None else {"resume": self.resume}
        return json.dumps(
            {
                **extra,
                "v": TOOL_MESSAGE_VERSION,
                "thread_id": self.thread_id,
                "tool_call_id": self.tool_call_id,
                "call_id": self.call_id,
                "tool_name": self.tool_name,
                "arguments": self.arguments,
                "thread_stack": self.thread_stack,
                "user_id": self.user_id,
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, body: str) -> ToolCallMessage:
        try:
            raw = json.loads(body)
        except json.JSONDecodeError as exc:
            raise MalformedMessageError(f"tool message is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise MalformedMessageError("tool message must be a JSON object")
        check_version(raw.get(FORMAT_FIELD), "this tool message")  # a newer release's call: not guessed at
        for name in ("thread_id", "tool_call_id", "tool_name"):
            if not isinstance(raw.get(name), str) or not raw[name]:
                raise MalformedMessageError(f"tool message needs a string {name!r}", field=name)
        arguments, stack = raw.get("arguments", {}), raw.get("thread_stack", [])
        if not isinstance(arguments, dict):
            raise MalformedMessageError("tool message 'arguments' must be an object", field="arguments")
        if not isinstance(stack, list) or not all(isinstance(t, str) for t in stack):
            raise MalformedMessageError("tool message 'thread_stack' must be a list of strings")
        call_id, user_id, resume = raw.get("call_id"), raw.get("user_id"), raw.get("resume")
        return cls(
            resume=resume if isinstance(resume, dict) else None,
            thread_id=raw["thread_id"],
            tool_call_id=raw["tool_call_id"],
            call_id=call_id if isinstance(call_id, str) else None,
            tool_name=raw["tool_name"],
            arguments=arguments,
            thread_stack=stack or [raw["thread_id"]],
            user_id=user_id if isinstance(user_id, str) else None,
        )


async def run_tool_call(
    tools: Mapping[str, Invocable],
    call: ToolCallMessage,
    time_limit: float | None,
    *,
    sender: InputSender | None = None,
    read_kept: ReadKept | None = None,
    input_wait: float = 0.0,
    oauth: OAuthServices | None = None,
) -> str | None:
    """The result text of one call (``Error: ...`` for anything the model should see as a failure), or
    ``None`` when an MCP tool asked the person a question and the call continues with their answer."""
    function_tool = tools.get(call.tool_name)
    if function_tool is None:
        return f"Error: no function tool named '{call.tool_name}' is registered with the tool runner"
    try:
        # Only a process with MCP servers has loaded the MCP module (a worker's cold start never imports it).
        mcp = sys.modules.get("stepagent.tools.mcp")
        if mcp is not None and isinstance(function_tool, mcp.McpTool) and sender is not None:
            from stepagent.tools.mcp_oauth import owner_of
            from stepagent.tools.mcp_runs import run_mcp_call

            wait = input_wait if time_limit is None else max(min(input_wait, time_limit - 1.0), 0.0)
            running: Any = run_mcp_call(
                function_tool,
                call.arguments,
                thread_id=call.thread_id,
                tool_call_id=call.tool_call_id,
                call_id=call.call_id,
                resume=call.resume,
                sender=sender,
                read_kept=read_kept,
                input_wait=wait,
                owner=owner_of(call.user_id, call.thread_stack),
                oauth=oauth,
            )
        else:
            running = function_tool.invoke(call.arguments)
        if time_limit is None:
            return cast(str | None, await running)
        return cast(str | None, await asyncio.wait_for(running, max(time_limit, 0.001)))
    except TimeoutError:
        return f"Error: tool '{call.tool_name}' did not finish within the tool runner's time limit"
    except Exception as exc:
        # What the model is told and what is retried is errors.classify's rule, as everywhere.
        if classify(exc) == "result":
            return f"Error: {exc}"
        raise


async def handle_tool_batch(
    event: SqsEvent,
    tools: Mapping[str, Invocable],
    queues: SqsQueues,
    sender: SqsSender,
    remaining_ms: Callable[[], int] | None = None,
    tracer: Tracer | None = None,
    metrics: DimensionedSink | None = None,
    read_kept: ReadKept | None = None,
    input_wait: float = 0.0,
    oauth: OAuthServices | None = None,
) -> BatchResponse:
    """Run every queued call concurrently and send each result to its thread. Never raises for a
    partial failure. With a ``tracer``, each run is an ``execute_tool`` span in the trace of the step that
    dispatched it, and the result carries that trace on. ``metrics`` receives each run's ``ToolLatency``."""

    async def one(record: SqsRecord) -> BatchItemFailure | None:
        message_id = str(record.get("messageId", ""))
        try:
            record_format(record, "this tool message")
            call = ToolCallMessage.parse(await queues.resolve(str(record.get("body", ""))))
        except Exception as exc:
            # Bad input ("reject") has no thread to tell and no copy of its own to keep: reporting it too
            # lets the queue move it to the tool DLQ, where it stays for inspection, never dropped.
            verdict = "rejected" if classify(exc) == "reject" else "failed; will be retried"
            logger.exception(f"unreadable tool message ({verdict})", extra={"message_id": message_id})
            return {"itemIdentifier": message_id}
        append_keys(thread_id=call.thread_id, tool_call_id=call.tool_call_id)
        limit = None if remaining_ms is None else remaining_ms() / 1000.0 - TIME_MARGIN_S
        attributes = tool_attributes(call.tool_name, call.tool_call_id, call.thread_id)
        if capture_content(tracer):
            attributes["gen_ai.tool.call.arguments"] = json.dumps(
                call.arguments, ensure_ascii=False, default=str
            )
        with continuing(record_traceparent(record)):
            async with traced(tracer, f"execute_tool {call.tool_name}", attributes) as span:
                started = time.monotonic()
                try:
                    text = await run_tool_call(
                        tools,
                        call,
                        limit,
                        sender=sender,
                        read_kept=read_kept,
                        input_wait=input_wait,
                        oauth=oauth,
                    )
                except Exception:  # classify says retry: this record alone goes back to the queue
                    logger.exception("tool run failed; will be retried", extra={"message_id": message_id})
                    return {"itemIdentifier": message_id}
                if text is None:  # a question or a sign-in went to the person; the call continues after it
                    logger.info("tool call waits for the person", extra={"tool": call.tool_name})
                    return None
                if metrics is not None:
                    publish_tool_latency(metrics, call.tool_name, (time.monotonic() - started) * 1000.0)
                if capture_content(tracer):
                    span.set_attributes({"gen_ai.tool.call.result": text})
                result = ToolResult.text(call.tool_call_id, text, call_id=call.call_id)
                try:
                    await sender.send(InputMessage.tool_result(call.thread_id, result), call.tool_call_id)
                except Exception:
                    logger.exception("could not send a tool result", extra={"message_id": message_id})
                    return {"itemIdentifier": message_id}
        logger.info("tool call answered", extra={"tool": call.tool_name, "error": text.startswith("Error: ")})
        return None

    # Each record runs in its own task, so the log keys set above stay with that record.
    results = await asyncio.gather(*(one(record) for record in event.get("Records", [])))
    return {"batchItemFailures": [failure for failure in results if failure is not None]}
