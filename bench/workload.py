"""A warm step-mode workload: the real worker handler (:class:`~stepagent.aws.worker.Worker`, the code the
Lambda runs for an SQS batch) driven with Lambda-shaped records, one record per invocation, on any store
pair, with the scripted model and a function tool run in process.

The conversation shape is the retained-growth gate's (:mod:`bench.memory`): ``slots`` interleaved
conversations, each user message ~2 KB and each tool result ~4 KB (both unique, so nothing is shared by
interning), a tool round trip for every user message, and a context window that makes every conversation
compact every few messages (a compaction child summarizes, closes, and the parent applies the summary).
Conversations are retired after :attr:`Workload.messages_per_conversation` messages and replaced by new
ones, as new conversations keep arriving at a long-lived worker — so anything kept per thread id grows.

Guarantees: deterministic (no clock, no randomness: same parameters, same steps); every output event is
counted and hashed and then dropped (:class:`NullQueues`), and the input queue holds only messages not yet
handled, so the workload itself retains nothing that grows with the number of steps (its bounded dedup
window fills during warm-up).
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from stepagent import texts
from stepagent.agent_config import DEFAULT_COMPACTION_THRESHOLD, AgentConfig
from stepagent.aws.lambda_events import SqsRecord
from stepagent.aws.outputs import OutputPublisher
from stepagent.aws.worker import CountingMetrics, Worker
from stepagent.core.completion import RetryPolicy
from stepagent.core.step import StepConfig
from stepagent.core.thread_cache import ThreadCache
from stepagent.messages import CompactionComplete, InputMessage, ToolResult
from stepagent.modes.step_mode import AgentSystem
from stepagent.providers.base import ModelProvider
from stepagent.providers.scripted import ScriptedProvider
from stepagent.providers.window import estimate_fixed
from stepagent.senders.sqs import Outgoing, SqsQueues
from stepagent.stores.base import ConversationStore, StateStore
from stepagent.tools.base import Tool, Toolset
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.functions import FunctionTool, InProcessFunctionRunner, tool

if TYPE_CHECKING:
    from types_aiobotocore_sqs import SQSClient

#: Recent (thread, dedup id) pairs the in-process queue remembers, as SQS FIFO's dedup window does.
DEDUP_WINDOW = 100
SUMMARY_TEXT = "SUMMARY of the conversation so far: the user asked for lookups and got results. " * 3


class NullQueues(SqsQueues):
    """The SQS client side of the worker with nothing behind it: sends are counted and hashed, then
    dropped; bodies resolve to themselves (no claim checks)."""

    def __init__(self) -> None:
        super().__init__(cast("SQSClient", None))  # never used: every method that would call it is replaced
        self.sent = 0
        self.digest = hashlib.sha256()

    async def send(
        self,
        queue_url: str,
        body: str,
        *,
        group_id: str | None = None,
        dedup_id: str | None = None,
        delay_seconds: int | None = None,
        attributes: Mapping[str, str] | None = None,
        claim_check: bool = True,
    ) -> str:
        self.sent += 1
        self.digest.update(body.encode())
        return f"null-{self.sent}"

    async def send_batch(self, queue_url: str, messages: Sequence[Outgoing]) -> None:
        for message in messages:
            await self.send(queue_url, message.body, group_id=message.group_id, dedup_id=message.dedup_id)

    async def resolve(self, body: str) -> str:
        return body


@dataclass
class InputQueue:
    """The input FIFO queue in process: pending messages only, with a bounded dedup window."""

    pending: deque[tuple[InputMessage, str]] = field(default_factory=deque)
    recent: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict)

    async def send(self, message: InputMessage, dedup_id: str) -> None:
        key = (message.group_id, dedup_id)
        if key in self.recent:
            return
        self.recent[key] = None
        if len(self.recent) > DEDUP_WINDOW:
            self.recent.popitem(last=False)
        logical = message if message.id is not None else message.model_copy(update={"id": dedup_id})
        self.pending.append((logical, dedup_id))


def lookup_tool(result_chars: int = 4000) -> FunctionTool[..., Any]:
    """A function tool whose every result is a unique text of ``result_chars`` (~4 KB by default)."""
    calls = 0

    @tool
    async def lookup(query: str) -> str:
        """Look something up."""
        nonlocal calls
        calls += 1
        seed = hashlib.sha256(f"{query}/{calls}".encode()).hexdigest()
        return "result: " + (seed * (result_chars // 64 + 1))[:result_chars]

    return lookup


def workload_script(
    window: int,
    *,
    summary: str = SUMMARY_TEXT,
    ack: str = "Looking it up.",
    answer: str = "Here is what I found.",
) -> dict[str, Any]:
    """The scripted model of the workload: a lookup per "please look up" message, then ``answer``; a
    compaction thread closes with ``summary``."""
    return {
        "context_window": window,
        "rules": [
            {
                "when": "INSIDE a compaction thread",
                "reply": [
                    {
                        "tool_call": {
                            "name": "close_thread",
                            "arguments": {"thread_id": "{thread_id}", "report_to_parent": summary},
                        }
                    }
                ],
            },
            {
                "when": "^please look up",
                "on": ["user"],
                "reply": [
                    {"text": ack},
                    {"tool_call": {"name": "lookup", "arguments": {"query": "{thread_id}"}}},
                ],
            },
            {"when": "^result: ", "on": ["tool_result"], "reply": [{"text": answer}]},
        ],
        "default": [{"text": "ok"}],
    }


def fixed_request_tokens(tools: list[Tool]) -> int:
    """Tokens of a request's fixed part (system prompt and tools) as the engine estimates them: the
    estimate its compaction trigger measures (:func:`stepagent.providers.window.request_estimate`)."""
    system = texts.DEFAULT_SYSTEM_PROMPT + texts.THREAD_SUFFIX.format(
        thread_id="x" * 40, root_thread_id="x" * 40
    )
    return estimate_fixed(system, Toolset.of(tools).specs())


def window_for(tools: list[Tool], conversation_tokens: int) -> int:
    """A context window in which a thread compacts once its conversation (beyond the fixed part) is
    estimated over ``conversation_tokens``: the engine's default threshold of the window, which for a
    window this size is also below the truncation budget (:func:`stepagent.providers.window.compaction_limit`)."""
    return math.ceil((fixed_request_tokens(tools) + conversation_tokens) / DEFAULT_COMPACTION_THRESHOLD)


@dataclass
class Workload:
    """Drives :class:`Worker` one record at a time. ``step()`` handles the next queued message (one
    invocation); ``run(n)`` keeps the queue fed with user messages round-robin over ``slots`` live
    conversations and handles ``n`` invocations."""

    conversation: ConversationStore
    state: StateStore
    worker: Worker
    queue: InputQueue
    outputs: NullQueues
    slots: int = 20
    messages_per_conversation: int = 12
    steps: int = 0
    user_messages: int = 0
    compactions_applied: int = 0
    tool_results: int = 0
    threads_seen: int = 0
    _generation: list[int] = field(default_factory=list)
    _sent: list[int] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        conversation: ConversationStore,
        state: StateStore,
        *,
        slots: int = 20,
        compact_after_tokens: int = 4000,
        provider: ModelProvider | None = None,
        result_chars: int = 4000,
        thread_cache: ThreadCache | None = None,
        agent: AgentConfig | None = None,
    ) -> Workload:
        """A worker over the given stores. ``compact_after_tokens``: how much conversation (beyond the fixed
        system prompt and tool specs) a thread holds before it compacts."""
        queue = InputQueue()
        lookup = lookup_tool(result_chars)
        tools: list[Tool] = [lookup, *builtin_tools()]
        window = window_for(tools, compact_after_tokens)
        config = StepConfig(
            provider=provider if provider is not None else ScriptedProvider(workload_script(window)),
            toolset=Toolset.of(tools),
            sender=queue,
            runner=InProcessFunctionRunner([lookup]),
            retry=RetryPolicy(max_attempts=1),
            clock=lambda: 1_000_000.0,  # compaction leases: a fixed clock keeps runs deterministic
            thread_cache=thread_cache,
            agent=agent if agent is not None else AgentConfig(),
        )
        system = AgentSystem(conversation, state, config)
        outputs = NullQueues()
        publisher = OutputPublisher(outputs, "output", conversation, state)

        async def no_dlq() -> str:
            raise AssertionError("the workload sends no bad input")

        worker = Worker(system, outputs, publisher, no_dlq, CountingMetrics())
        return cls(conversation, state, worker, queue, outputs, slots=slots)

    def _next_user_message(self) -> tuple[InputMessage, str]:
        if not self._generation:
            self._generation = [0] * self.slots
            self._sent = [0] * self.slots
        slot = self.user_messages % self.slots
        if self._sent[slot] == self.messages_per_conversation:
            self._generation[slot] += 1  # this conversation is over; a new one takes its place
            self._sent[slot] = 0
        if self._sent[slot] == 0:
            self.threads_seen += 1
        self._sent[slot] += 1
        self.user_messages += 1
        thread = f"conv-{slot:02d}-{self._generation[slot]:04d}"
        seed = hashlib.sha256(f"user/{self.user_messages}".encode()).hexdigest()
        text = f"please look up item {self.user_messages}: " + (seed * 32)[:2000]
        message_id = f"user-{self.user_messages}"
        return InputMessage.user_text(thread, text, id=message_id), message_id

    async def step(self) -> None:
        """Handle one message as one Lambda invocation with a one-record batch (feeding a user message
        first if nothing is queued)."""
        if not self.queue.pending:
            await self.queue.send(*self._next_user_message())
        message, dedup_id = self.queue.pending.popleft()
        if isinstance(message.synthetic, CompactionComplete):
            self.compactions_applied += 1
        elif isinstance(message.content, ToolResult) and (message.content.first_text() or "").startswith(
            "result: "
        ):
            self.tool_results += 1
        self.steps += 1
        record: SqsRecord = {
            "messageId": f"record-{self.steps}",
            "body": message.to_json(),
            "attributes": {
                "MessageGroupId": message.group_id,
                "MessageDeduplicationId": dedup_id,
                "ApproximateReceiveCount": "1",
            },
        }
        result = await self.worker.handle({"Records": [record]})
        if result["batchItemFailures"]:
            raise AssertionError(f"step {self.steps} failed: {result}")

    async def run(self, steps: int) -> None:
        for _ in range(steps):
            await self.step()
