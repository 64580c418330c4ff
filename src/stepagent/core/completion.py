"""The completion round loop: stream model output into the turn buffer, act on at most one tool call per
round, loop back after synchronous tools and unknown-tool errors.

Guarantees:

- Retries (retryable provider errors, streams that end without ``Final``) discard the partial turn and
  rebuild the request from committed history; they are bounded by attempts and by the caller's deadline.
- Once a round's tool call was emitted, the rest of the stream is ignored (so the call stays the tail of
  history) and a later stream failure ends the round instead of retrying it.
- A synchronous tool runs only after the history holding its call — and a dispatch intent for it — is
  committed, so a crash mid-tool is re-driven by the next step instead of wedging the thread. The round
  loop decides (the call, its intent, its index entry); :meth:`~stepagent.core.effects.StepEffects.run_inline`
  commits and runs: this module performs no write of its own.
- Every tool call gets a thread-unique id: a provider id that is empty or already used is replaced by
  one derived from the call's row id (so a re-run is byte-identical).
- Loop-backs are capped per step, so a model that keeps calling unknown tools cannot spin forever.
- Cancellation (the ``cancel`` event, set by local mode when user text interrupts or the system shuts
  down) takes effect at once, even while the provider waits for its next chunk or a retry backs off: the
  visible partial turn is kept (trailing reasoning trimmed) and the round is never retried.
- Limits: before every model call the thread's per-turn count and the conversation's spend (plus this
  step's calls so far) are checked against ``limits``; a reached limit ends the rounds with
  ``outcome.limit`` and no call is made.
- Structured output: with an ``output_schema`` (root threads only), a round that ends the turn with text
  has that text validated; an invalid answer is followed by a user item listing the errors and another
  round, at most ``output_retries`` times, then ``outcome.output_errors``.
- A request that cannot fit the model's window even with every tool output truncated, or that would be
  truncated while compaction can make room, is never sent: the round ends with
  ``outcome.needs_compaction`` (the step compacts the thread and answers afterwards) instead of failing;
  a compaction thread, which cannot compact itself, and unanswered inputs that fill the window alone are
  shown the newest part that fits, after a note. A window that cannot hold even the system prompt, tools
  and output reserve ends the round with ``outcome.refusal`` (no model call, no compaction).
- Every finished call measures the provider's tokens per estimated token (``estimate_scale``), which
  later requests of the step, and of the thread through its head, carry.
- Usage: ``outcome.usage`` is the last finished model call's (what compaction measures),
  ``outcome.step_usage`` the sum over every finished call of the step, ``outcome.completions`` their
  number. Each model call and each inline tool run is a span of ``tracer`` (if any).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from stepagent import texts
from stepagent.backoff import Backoff
from stepagent.core.agents import ThreadAgent, system_prompt
from stepagent.core.effects import StepEffects
from stepagent.core.history import HistoryManager
from stepagent.core.limits import Limits
from stepagent.errors import InvariantViolation, ProviderError
from stepagent.events import (
    AgentEvent,
    Info,
    LimitReached,
    TextChunk,
    ThinkingChunk,
    ThinkingEnded,
    ThinkingStarted,
    ToolCallStarted,
    ToolResultReceived,
)
from stepagent.history_items import (
    INJECTED_TOOL_NAME,
    AssistantText,
    EventItem,
    HistoryItem,
    Reasoning,
    ToolCallItem,
    ToolResultItem,
    UserItem,
    with_decisions_applied,
)
from stepagent.ids import completion_id, fresh_tool_call_id
from stepagent.messages import ImageBlock, TextBlock, TextContent, ToolCall, ToolResult
from stepagent.output_schema import OUTPUT_CHECK_ID, OutputSchema, output_feedback
from stepagent.providers.base import (
    CacheTtl,
    Final,
    ModelInfo,
    ModelRequest,
    ReasoningComplete,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallComplete,
    ToolCallDelta,
    Usage,
)
from stepagent.providers.prices import CATALOG_PRICES, PriceTable
from stepagent.providers.window import (
    compaction_first,
    estimate_fixed,
    estimate_scale,
    fixed_part_error,
    newest_that_fit,
    overflows,
    request_estimate,
    too_large_to_compact,
)
from stepagent.stores.base import DispatchIntent, Spend, ThreadKind
from stepagent.telemetry import content
from stepagent.tracing import (
    AttributeValue,
    Span,
    Tracer,
    capture_content,
    chat_attributes,
    response_attributes,
    traced,
    usage_attributes,
)

MAX_ROUNDS_PER_STEP = 25


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Backoff for retryable provider failures. ``remaining`` returns the seconds the caller has left
    (the Lambda's remaining time); a retry that would not fit is not attempted."""

    max_attempts: int = 4
    base_delay: float = 1.0
    max_delay: float = 30.0
    safety_margin: float = 10.0
    remaining: Callable[[], float] | None = None
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def _backoff(self) -> Backoff:
        return Backoff(attempts=self.max_attempts, base=self.base_delay, cap=self.max_delay)

    def delay(self, attempt: int, error: ProviderError | None) -> float:
        return self._backoff().delay(attempt, error.retry_after if error is not None else None)

    def allows(self, attempt: int, delay: float) -> bool:
        remaining = None if self.remaining is None else self.remaining()
        return self._backoff().allows(attempt, delay, remaining, self.safety_margin)


@dataclass(slots=True)
class CompletionOutcome:
    """What the completion phase decided: the asynchronous call to dispatch, usage, and how it ended."""

    action: ToolCallItem | None = None
    usage: Usage | None = None
    step_usage: Usage | None = None
    completions: int = 0
    error: ProviderError | None = None
    executed_sync_calls: list[str] = field(default_factory=list)
    cancelled: bool = False
    #: The limit that stopped the step before a model call, if one did.
    limit: LimitReached | None = None
    #: The validated structured output of the final answer (``has_output``), or the problems of the last
    #: answer when the retries ran out (``output_errors``).
    output: Any = None
    has_output: bool = False
    output_errors: list[str] = field(default_factory=list)
    #: The next request could not fit the window even truncated: the thread must compact first.
    needs_compaction: bool = False
    #: Why the model was not called at all (a message for people: the window cannot hold even the fixed
    #: part of a request, or an input was too large to show); the step ends the turn with it as an error.
    refusal: str | None = None


@dataclass(slots=True)
class CompletionRunner:
    """Runs the model rounds of one step against one thread's history (inline tools, retries, streaming)."""

    #: The agent the thread runs as (``core/agents.py``): its model, tools, options, limits, output schema
    #: and approval policy.
    agent: ThreadAgent
    history: HistoryManager
    #: Performs the rounds' writes: the commit before a synchronous tool runs, and the run itself.
    effects: StepEffects
    emit: Callable[[AgentEvent], None]
    message_id: str
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    cancel: asyncio.Event | None = None
    tracer: Tracer | None = None
    #: Model prices, for the cost limit (a model without prices: the cost limit never binds).
    prices: PriceTable = CATALOG_PRICES
    #: How long the provider's prompt cache should keep what this step's requests write.
    cache_ttl: CacheTtl = "5m"
    #: The provider's tokens per estimated token on the thread's last request (``1.0``: not measured);
    #: each finished call measures it again.
    estimate_scale: float = 1.0
    #: The request's system prompt (from the agent's instructions and tools and the thread's root).
    system_prompt: str = field(init=False)
    #: Whether a request that cannot fit is held back for compaction (``False`` in a compaction thread,
    #: which cannot compact itself: its request goes out truncated as far as it can be).
    compact_on_overflow: bool = field(init=False)
    limits: Limits = field(init=False)
    _counter: int = 0
    _thinking: bool = False

    def __post_init__(self) -> None:
        agent, info = self.agent, self.history.info
        self.system_prompt = system_prompt(
            agent.instructions, agent.toolset, root_thread_id=self.history.root_thread_id
        )
        self.compact_on_overflow = info is None or info.kind != ThreadKind.COMPACTION
        self.limits = Limits(
            agent.max_model_calls_per_turn, agent.max_conversation_tokens, agent.max_conversation_cost_usd
        )

    @property
    def model(self) -> ModelInfo:
        return self.agent.info

    @property
    def output_schema(self) -> OutputSchema | None:
        return self.agent.output_schema

    def _request(self) -> ModelRequest:
        request = self._plain_request()
        if self.compact_on_overflow and too_large_to_compact(request) is None:
            return request
        # A compaction thread cannot compact itself, and unanswered inputs that fill the window alone
        # leave nothing to compact: the model is shown the newest part that fits, after a note saying so.
        return dataclasses.replace(request, history=newest_that_fit(request))

    def _plain_request(self) -> ModelRequest:
        """The request from the whole visible history (nothing left out to fit the window)."""
        model = self.model
        return ModelRequest(
            system=self.system_prompt,
            history=model_view(self.history.history, model.supports_image_input),
            tools=self.agent.toolset.specs(),
            model=model,
            thread_stack=self.history.thread_stack,
            max_tokens=self.agent.max_tokens,
            temperature=self.agent.temperature,
            output_schema=self.output_schema.schema if self.output_schema is not None else None,
            output_schema_class=self.output_schema.class_name if self.output_schema is not None else None,
            cache_ttl=self.cache_ttl,
            estimate_scale=self.estimate_scale,
            estimate_scale_covers_outputs=not self.compact_on_overflow,
        )

    def _next_id(self) -> str:
        cid = completion_id(self.history.thread_id, self.message_id, self._counter)
        self._counter += 1
        return cid

    def _end_thinking(self) -> None:
        if self._thinking:
            self._thinking = False
            self.emit(ThinkingEnded())

    async def run(self) -> CompletionOutcome:
        outcome = CompletionOutcome()
        retries = 0
        for _ in range(MAX_ROUNDS_PER_STEP):
            if self.cancel is not None and self.cancel.is_set():
                outcome.cancelled = True  # interrupted between rounds: the next step starts afresh
                return outcome
            outcome.limit = self._limit_hit(outcome)
            if outcome.limit is not None:
                return outcome
            start = len(self.history.history)
            loop_back = await self._round(outcome)
            if outcome.error is not None or outcome.cancelled:
                return outcome
            if loop_back:
                continue
            if outcome.action is not None or self.output_schema is None:
                return outcome
            if self.history.waiting_for_approval() is not None:
                return outcome  # the round ended on a call waiting for a person: not the turn's answer
            verdict = self.output_schema.check(self._answer_since(start))
            if verdict.ok:
                outcome.output, outcome.has_output = verdict.value, True
                return outcome
            if retries >= self.agent.output_retries:
                outcome.output_errors = verdict.errors
                return outcome
            retries += 1
            # The errors go back to the model as the next user turn; its row id is fixed by the step's
            # input and the attempt, so a re-run of the step writes the same history.
            feedback = UserItem(content=TextContent(text=output_feedback(verdict.errors)))
            self.history.append_generated(feedback, f"{self.message_id}{OUTPUT_CHECK_ID}{retries}")
        self.emit(Info(f"Stopped after {MAX_ROUNDS_PER_STEP} model rounds in one step"))
        return outcome

    def _limit_hit(self, outcome: CompletionOutcome) -> LimitReached | None:
        spent = self.history.snapshot.spend
        if outcome.step_usage is not None:
            cost = self.prices.cost(self.agent.model, outcome.step_usage)
            spent = Spend(spent.tokens + outcome.step_usage.total_tokens, spent.cost_usd + (cost or 0.0))
        return self.limits.reached(model_calls=self.history.turn_model_calls, spend=spent)

    def _answer_since(self, start: int) -> str:
        """The assistant text the last round added (the final answer to validate)."""
        return "".join(item.text for item in self.history.history[start:] if isinstance(item, AssistantText))

    async def _round(self, outcome: CompletionOutcome) -> bool:
        """One round with retries. Returns whether another round should follow."""
        request = self._plain_request()
        window = request.model.context_window
        problem = fixed_part_error(request.system, request.tools, window, request.output_limit)
        if problem is not None:
            outcome.refusal = problem  # no request can fit, and no compaction can help
            return False
        if self.compact_on_overflow and overflows(request):
            if too_large_to_compact(request) is None:
                outcome.needs_compaction = True  # never sent: it would fail; compaction makes room
                return False
            self.emit(Info(texts.INPUTS_OMITTED.format(window=window)))  # _request shows the newest part
        elif self.compact_on_overflow and compaction_first(request):
            outcome.needs_compaction = True  # sent now, its tool outputs would be truncated
            return False
        attempt = 0
        while True:
            attempt += 1
            state = _RoundState(capture=capture_content(self.tracer))
            try:
                async with self._chat_span() as span:
                    finished = await self._stream(state, outcome)
                    if self.tracer is not None:
                        span.set_attributes(state.span_attributes())
            except ProviderError as error:
                self._end_thinking()
                if state.emitted_call:
                    return state.loop_back  # the call is committed as the tail: finish, never retry
                if not error.retryable:
                    self.history.flush_turn(trim_reasoning=True)
                    outcome.error = error
                    return False
                if await self._backoff(attempt, error, f"Stream error ({error}), retrying..."):
                    continue
                self.history.turn.discard()
                raise
            if finished or state.emitted_call or outcome.cancelled:
                return state.loop_back
            # The stream ended without Final and before any tool call: the turn is incomplete.
            if await self._backoff(attempt, None, "Stream error (unexpected end), retrying..."):
                continue
            self.history.turn.discard()
            raise ProviderError("the model stream kept ending before it finished", retryable=True)

    def _chat_span(self) -> AbstractAsyncContextManager[Span]:
        """The ``chat {model}`` span of one model call (nothing is built with tracing off)."""
        if self.tracer is None:
            return traced(None, "", {})
        model = self.model
        attributes = chat_attributes(model.provider, model.model_id, self.history.thread_id)
        return traced(self.tracer, f"chat {attributes['gen_ai.request.model']}", attributes)

    async def _backoff(self, attempt: int, error: ProviderError | None, message: str) -> bool:
        delay = self.retry.delay(attempt, error)
        if not self.retry.allows(attempt, delay):
            return False
        self.history.turn.discard()
        self.emit(Info(message))
        await self._pause(delay)
        return True

    async def _pause(self, delay: float) -> None:
        """The retry backoff; cut short by cancellation (the next round then stops at once)."""
        if self.cancel is None:
            await self.retry.sleep(delay)
            return
        sleeping = asyncio.ensure_future(self.retry.sleep(delay))
        cancelled = asyncio.ensure_future(self.cancel.wait())
        try:
            await asyncio.wait({sleeping, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()
            cancelled.cancel()

    async def _until_cancelled(self, events: AsyncIterator[StreamEvent]) -> AsyncIterator[StreamEvent]:
        """``events``, ending as soon as ``cancel`` is set — also while the provider is still waiting for its
        next chunk, so a model that stays silent for a minute cannot delay an interruption or a shutdown."""
        cancel = self.cancel
        if cancel is None:
            async for event in events:
                yield event
            return
        while not cancel.is_set():
            next_event = asyncio.ensure_future(_next_or_none(events))
            cancelled = asyncio.ensure_future(cancel.wait())
            try:
                await asyncio.wait({next_event, cancelled}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                cancelled.cancel()
                if not next_event.done():
                    next_event.cancel()  # the provider's stream ends here (CancelledError inside it)
                    await asyncio.wait({next_event})
            if next_event.cancelled():
                return
            received = next_event.result()  # a chunk that arrived first still counts; errors propagate
            if received is None:
                return
            yield received

    async def _stream(self, state: _RoundState, outcome: CompletionOutcome) -> bool:
        """Consume one stream. Returns ``True`` when it ended with ``Final``."""
        history = self.history
        if not history.turn.is_empty:
            raise InvariantViolation("bug: a round started with a non-empty turn buffer")
        request = self._request()
        state.asked(request)
        async for event in self._until_cancelled(self.agent.provider.stream(request)):
            if self.cancel is not None and self.cancel.is_set():
                self._end_thinking()
                history.flush_turn(trim_reasoning=True)
                outcome.cancelled = True
                return False
            if isinstance(event, ReasoningComplete) and event.signature is None and event.redacted is None:
                continue  # providers reject unsigned reasoning when it is sent back
            chunk_id = self._next_id()
            if state.emitted_call and not isinstance(event, Final):
                continue  # keep the dispatched call the tail of history
            match event:
                case TextDelta(text=text):
                    self._end_thinking()
                    state.saw_text(text)
                    history.turn.add(AssistantText(text), chunk_id)
                    self.emit(TextChunk(text))
                case ReasoningDelta(text=text):
                    if not self._thinking:
                        self._thinking = True
                        self.emit(ThinkingStarted())
                    self.emit(ThinkingChunk(text))
                case ReasoningComplete(text=text, signature=signature, redacted=redacted):
                    self._end_thinking()
                    history.turn.add(Reasoning(text, signature, redacted), chunk_id)
                case ToolCallDelta(name=name, arguments_delta=delta):
                    self.emit(ThinkingChunk(f"Invoking tool: {name}" if name else delta))
                case ToolCallComplete(call=call):
                    self._end_thinking()
                    state.emitted_call = True
                    call = await self._thread_unique(call, chunk_id)
                    state.saw_call(call)
                    await self._on_tool_call(call, chunk_id, state, outcome)
                case Final(usage=usage):
                    self._end_thinking()
                    state.final = event
                    history.flush_turn()
                    outcome.completions += 1
                    history.turn_model_calls += 1
                    if usage is not None:
                        self._measure(request, event)
                        outcome.usage = usage
                        outcome.step_usage = (
                            usage if outcome.step_usage is None else outcome.step_usage + usage
                        )
                    return True
        if self.cancel is not None and self.cancel.is_set():
            # Cancelled while waiting for the next chunk: keep the visible partial turn, never retry.
            self._end_thinking()
            history.flush_turn(trim_reasoning=True)
            outcome.cancelled = True
        return False

    def _measure(self, request: ModelRequest, final: Final) -> None:
        """Measure the provider's tokens per estimated token on ``request`` (as sent: truncated, if it
        was) from its usage; later requests of the thread scale their estimate by it."""
        usage = final.usage
        if usage is None:
            return
        reported = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
        truncation = final.extra.get("truncation")
        if isinstance(truncation, dict) and isinstance(truncation.get("estimate_after"), int):
            estimated = estimate_fixed(request.system, request.tools) + truncation["estimate_after"]
        else:
            estimated = request_estimate(request.system, request.tools, request.history)
        scale = estimate_scale(reported, estimated)
        if scale is not None:
            self.estimate_scale = self.history.estimate_scale = scale

    async def _thread_unique(self, call: ToolCall, chunk_id: str) -> ToolCall:
        """``call``, renamed when its id is empty or already used in this thread (OpenAI-compatible servers
        and open models repeat or omit ids): a result for a reused id would be absorbed as a duplicate,
        and a second spawn with it would find the first child. The new id is derived from the call's
        row id, so a re-run of this step is byte-identical."""
        if not await self.history.tool_call_id_taken(call.id):
            return call
        attempt = 0
        while await self.history.tool_call_id_taken(
            new := fresh_tool_call_id(self.history.thread_id, chunk_id, attempt)
        ):
            attempt += 1
        return call.model_copy(update={"id": new})

    async def _on_tool_call(
        self, call: ToolCall, chunk_id: str, state: _RoundState, outcome: CompletionOutcome
    ) -> None:
        history = self.history
        tool = self.agent.toolset.get(call.name)
        display = tool.display(call.arguments) if tool is not None else None
        waits = tool is not None and self.agent.needs_approval(tool)
        history.turn.add(ToolCallItem(call=call, display_as=display, needs_approval=waits), chunk_id)
        history.flush_turn()
        if call.name == INJECTED_TOOL_NAME or tool is None:
            forbidden = call.name == INJECTED_TOOL_NAME
            text = texts.FORBIDDEN_TOOL if forbidden else texts.UNKNOWN_TOOL.format(name=call.name)
            result = ToolResult.text(call.id, text, call_id=call.call_id)
            history.append_generated(ToolResultItem(result=result), f"{call.id}-unknown-tool")
            state.loop_back = True
            return
        self.emit(
            ToolCallStarted(
                name=call.name, arguments=call.arguments, tool_call_id=call.id, display_as=display
            )
        )
        if waits:
            # Committed without an intent: nothing runs until a person's decision (core/approval.py).
            if tool.referenced_later:
                history.pending.index_call(call)
            return
        if not tool.inline:
            outcome.action = ToolCallItem(call=call, display_as=display)
            if tool.referenced_later:
                history.pending.index_call(call)
            return
        # An intent to run it: the seam commits it with the call before the tool runs, so a crash from
        # there on is re-driven.
        history.pending.add_intent(DispatchIntent(call.id, call.name, call.arguments, call.call_id))
        if tool.referenced_later:
            history.pending.index_call(call)
        result = await self.effects.run_inline(tool, call)
        first = result.first_text()
        if first is not None:
            self.emit(ToolResultReceived(segments=[{"type": "text", "content": first}]))
        history.append_generated(ToolResultItem(result=result), sync_result_id(call.id))
        outcome.executed_sync_calls.append(call.id)
        state.loop_back = True


@dataclass(slots=True)
class _RoundState:
    emitted_call: bool = False
    loop_back: bool = False
    #: What the round's ``chat`` span reports: the model's closing event and (content capture) its text.
    capture: bool = False
    final: Final | None = None
    text: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    request: ModelRequest | None = None

    def asked(self, request: ModelRequest) -> None:
        if self.capture:
            self.request = request

    def saw_text(self, text: str) -> None:
        if self.capture:
            self.text.append(text)

    def saw_call(self, call: ToolCall) -> None:
        if self.capture:
            self.calls.append(call)

    def span_attributes(self) -> dict[str, AttributeValue]:
        final = self.final
        usage = (final.usage if final is not None else None) or Usage()
        reason = final.stop_reason if final is not None else None
        attributes = usage_attributes(
            usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_write_tokens, reason
        )
        if final is not None:
            attributes.update(response_attributes(final.response_id, final.response_model))
        if self.capture:
            if self.request is not None:
                attributes["gen_ai.system_instructions"] = content.system_instructions(self.request.system)
                attributes["gen_ai.input.messages"] = content.input_messages(self.request.history)
            if self.text or self.calls:
                attributes["gen_ai.output.messages"] = content.output_messages(
                    "".join(self.text), self.calls, reason
                )
        return attributes


def model_view(history: Sequence[HistoryItem], supports_image_input: bool) -> list[HistoryItem]:
    """The history as the model is shown it: people's decisions on calls applied (an edited call shows its
    edited arguments, decision rows are not shown), and for a model without image input, every image block
    inside a tool result (or event result) replaced by a text placeholder. Stored history is never changed."""
    history = with_decisions_applied(history)
    if supports_image_input:
        return history
    view: list[HistoryItem] = []
    for item in history:
        if isinstance(item, ToolResultItem | EventItem) and any(
            isinstance(block, ImageBlock) for block in item.result.content
        ):
            content = [
                TextBlock(text=texts.IMAGE_OMITTED) if isinstance(block, ImageBlock) else block
                for block in item.result.content
            ]
            result = ToolResult(id=item.result.id, call_id=item.result.call_id, content=content)
            item = dataclasses.replace(item, result=result)
        view.append(item)
    return view


async def _next_or_none(events: AsyncIterator[StreamEvent]) -> StreamEvent | None:
    return await anext(events, None)


def sync_result_id(tool_call_id: str) -> str:
    """The row id of a synchronous tool's result: the same whether it ran in its step or was re-driven."""
    return f"{tool_call_id}-sync-result"
