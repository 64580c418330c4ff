"""One step of one thread: re-drive the outbox → prepare inputs → interruption side effects → complete →
**commit** → observe → dispatch.

This module decides what the step does; it performs no write itself. Every commit, state change, send,
spawn, tool run and dispatch goes through :class:`~stepagent.core.effects.StepEffects` (the seam), whose
docstring holds the durability argument (why no crash loses or duplicates anything) and the order of the
writes. What it relies on here:

- Sync before dispatch: the asynchronous call and its dispatch intent are committed, atomically with the
  step's inputs and rows, before the tool is dispatched (:class:`~stepagent.core.effects.StepEnd`).
- Outbox: an intent is marked done only after its dispatch; every step first re-drives open intents with
  the same idempotency key (the tool call id), so no crash point leaves an unanswered, undispatched call.
- Resume: a redelivered input that is already processed, on a thread whose history still ends with
  something the model has not answered, makes the step run the completion it owes.
- Deferral: while a non-passive tool call is pending, reports/events/parent messages are stored durably
  and delivered after the call's result (user text still interrupts); so is a non-associative
  subscription event that arrives before its own subscription's start result.
- Agent: the thread runs as the agent its root's metadata selects (``core/agents.py``); an unknown
  profile rejects the step's inputs before anything is written.
- Usage: a step that runs the model commits one :class:`~stepagent.stores.base.UsageRecord` (tokens summed
  over its model calls, the model's name, whether the turn is complete) with its rows. When the step
  leaves the thread with nothing pending — no open tool call, no held input, not interrupted — it emits
  :class:`~stepagent.events.TurnComplete` after everything else, carrying that record's usage.
- Limits: before every model call, the thread's model calls since its last user text (on its head) and
  the conversation's spend (with the root's metadata) are checked (``core/limits.py``); a reached limit
  emits :class:`~stepagent.events.LimitReached` after the commit instead of calling the model, then the
  turn completes. The usage record's tokens and cost are added to the root's spend by the same commit.
- Structured output: the root thread's validated final answer travels in ``TurnComplete.output`` (and in
  the usage record, so a redelivery re-reports it); answers that stay invalid end with a ``StepFailed``
  (not retrying) naming the errors.
- Tracing: model calls and tool runs and dispatches are spans of ``StepConfig.tracer`` (none by default),
  children of the step's span (``modes/step_mode.py``); tracing can never fail a step (``stepagent.tracing``).
- Reads: the step starts with one snapshot of the thread (``HistoryManager.load``; a warm worker's
  cache makes it read only new rows) and skips the outbox, deferral and choice reads the snapshot says
  are empty.
- Approval: a call whose tool needs a person's decision is committed without an intent and nothing is
  dispatched (:class:`~stepagent.events.ApprovalRequested`; no ``TurnComplete``: the thread waits). A
  decision (``core/approval.py``) that approves the call is committed with the call's intent *before* the
  call runs, then the call is driven exactly like a re-driven outbox intent.
- Turn flag: the step's last commit says whether it left the thread with nothing pending
  (:mod:`stepagent.core.turn`); any earlier commit of the step says the turn is still running.
- Compaction: decided from the runtime's own estimate of the next request — the one truncation uses,
  scaled by the provider's measured tokens per estimated token (``providers/window.py``) — against a
  limit below truncation's budget, so a thread compacts before it would truncate. A request that would be
  truncated or cannot fit at all is not sent: the step asks for compaction and keeps the turn open, and
  the step that applies the summary answers (a redelivered input asks again for a compaction a crash
  lost). The summary never covers the inputs the model has not answered yet.
- What cannot fit is said: a window smaller than the fixed part of a request, and a user message larger
  than the window (which history keeps as a marked stand-in), end the turn with an error
  (``StepFailed``, not retrying) and no model call; no compaction runs for either.
- Prompt cache: the step's requests carry the TTL ``STEPAGENT_PROMPT_CACHE_TTL`` selects
  (:mod:`stepagent.core.cache_ttl`); a turn's end and the gap before the person's next message are
  recorded on the head (``ThreadInfo.turn_ended_at``, ``person_gap``) for ``auto`` to predict from.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from stepagent.agent_config import DEFAULT_COMPACTION_THRESHOLD, AgentConfig
from stepagent.core.agents import ThreadAgent, check_agents, output_limit, resolve_agent, system_prompt
from stepagent.core.cache_ttl import (
    choose_ttl,
    input_wait_kinds,
    is_slow_person,
    is_slow_wait,
    latest_call_kind,
)
from stepagent.core.completion import (
    CompletionOutcome,
    CompletionRunner,
    RetryPolicy,
    model_view,
    sync_result_id,
)
from stepagent.core.effects import StepEffects, StepEnd, ToolServices
from stepagent.core.history import HistoryManager
from stepagent.core.limits import Limits
from stepagent.core.prepare import Preparer
from stepagent.core.thread_cache import ThreadCache
from stepagent.core.turn import turn_is_complete
from stepagent.events import (
    AgentEvent,
    ApprovalRequested,
    CompletionFinished,
    CompletionStarted,
    Info,
    LimitReached,
    Observer,
    StepFailed,
    TurnComplete,
    kept_notice,
)
from stepagent.history_items import EventItem, Summary, ToolResultItem, UserItem
from stepagent.ids import derived_id
from stepagent.messages import (
    ApprovalDecision,
    Compaction,
    CompactionComplete,
    InputMessage,
    SubscriptionEvent,
    TextContent,
    ToolCall,
    ToolResult,
    UserChoiceRequired,
    is_deferrable_synthetic,
)
from stepagent.providers.base import ModelProvider, Usage
from stepagent.providers.prices import CATALOG_PRICES, PriceTable
from stepagent.providers.window import (
    INPUT_NOT_SHOWN,
    INPUT_TOO_LARGE,
    compaction_helps,
    estimate_item,
    input_room,
)
from stepagent.senders.base import InputSender
from stepagent.stores.base import (
    ConversationStore,
    DeferredInput,
    DispatchIntent,
    StateStore,
    ThreadKind,
    UsageRecord,
)
from stepagent.tools.base import (
    FunctionRunner,
    LifecycleNotifier,
    TimerBackend,
    Toolset,
)
from stepagent.tracing import Tracer


@dataclass(slots=True)
class StepConfig:
    """Everything a step needs besides the stores.

    ``provider`` is the default agent's model and ``toolset`` every tool the deployment has (what a thread
    is offered is chosen per thread from ``agent``: :mod:`stepagent.core.agents`). ``providers`` holds the
    models of profiles that name one (``<provider>:<model id>`` → provider). ``tracer`` receives the
    spans of steps, model calls and tool runs (none: no tracing). Building a config checks that every
    profile can be served (``ConfigurationError`` otherwise)."""

    provider: ModelProvider
    toolset: Toolset
    sender: InputSender
    agent: AgentConfig = field(default_factory=AgentConfig)
    providers: Mapping[str, ModelProvider] = field(default_factory=dict)
    callback_url: str | None = None
    timers: TimerBackend | None = None
    runner: FunctionRunner | None = None
    notifier: LifecycleNotifier | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    tracer: Tracer | None = None
    compaction_lease_seconds: float = 3600.0
    clock: Callable[[], float] = time.time
    #: A warm worker's cache of loaded threads (``core/thread_cache.py``); ``None``: every step reads all.
    thread_cache: ThreadCache | None = None
    #: Model prices, for ``cost_usd`` in usage records and events and for the conversation cost limit.
    prices: PriceTable = CATALOG_PRICES

    def __post_init__(self) -> None:
        check_agents(
            self.agent,
            self.toolset,
            self.providers,
            default_model=self.provider.info.name,
            prices=self.prices,
        )


def should_compact(usage: Usage | None, context_window: int, threshold: float = 0.75) -> bool:
    """The reference's rule: total tokens strictly above the threshold of a known context window."""
    return usage is not None and context_window > 0 and usage.total_tokens > context_window * threshold


@dataclass(slots=True)
class StepOutcome:
    """What one step of one thread did: whether it ran to its commit, the model usage, the error if any."""

    thread_id: str
    completed: bool = False
    usage: Usage | None = None
    context_window: int = 0
    error: str | None = None


@dataclass(frozen=True, slots=True)
class StepInput:
    """One input of a step: the message, its logical id (the dedup id every redelivery carries) and the
    W3C trace context it arrived with (``None``: it starts a trace of its own)."""

    message: InputMessage
    message_id: str
    traceparent: str | None = None


class ThreadStep:
    """Runs one step for one thread. Create one per (thread, batch)."""

    def __init__(
        self,
        conversation: ConversationStore,
        state: StateStore,
        config: StepConfig,
        observer: Observer,
        thread_id: str,
        *,
        cancel: asyncio.Event | None = None,
    ) -> None:
        self.conversation = conversation
        self.state = state
        self.config = config
        self.observer = observer
        self.thread_id = thread_id
        self.cancel = cancel
        self.history: HistoryManager | None = None
        #: Performs every write of the step (``core/effects.py``); built once the thread is loaded.
        self.effects: StepEffects | None = None
        self._held = False  # whether this step deferred an input (the thread then has input pending)
        self._slow_wait = False  # whether the step resumes the thread from a slow wait (cache TTL)

    def emit(self, event: AgentEvent) -> None:
        self.observer.on_event(self.thread_id, event)

    # ---- the step -----------------------------------------------------------------------------------------

    async def run(self, inputs: Sequence[StepInput]) -> StepOutcome:
        # Calls the batch answers or decides: whether each is answered comes with the thread's first read.
        tool_result_ids = [
            content.id if isinstance(content, ToolResult) else content.tool_call_id
            for i in inputs
            if isinstance(content := i.message.content, ToolResult | ApprovalDecision)
        ]
        history = self.history = await HistoryManager.load(
            self.conversation,
            self.state,
            self.thread_id,
            message_ids=[i.message_id for i in inputs],
            tool_call_ids=tool_result_ids,
            cache=self.config.thread_cache,
        )
        await history.prefetch([i.message_id for i in inputs], tool_result_ids)
        config = self.config
        self.effects = StepEffects(
            history,
            self.conversation,
            self.state,
            services=ToolServices(
                sender=config.sender,
                callback_url=config.callback_url,
                timers=config.timers,
                runner=config.runner,
                notifier=config.notifier,
            ),
            toolset=config.toolset,
            emit=self.emit,
            tracer=config.tracer,
        )

        # An unknown profile rejects the inputs before anything is written (or dispatched).
        metadata = history.metadata
        for item in inputs:
            if item.message.metadata is not None:
                metadata = item.message.metadata
        self._agent(history, metadata)

        owes_completion = await self._redrive_outbox(history)
        if history.info is not None and history.info.closed:
            history.turn_complete = True
            await self._effects.commit()
            return StepOutcome(self.thread_id)

        pending = history.pending_tool_call()
        open_calls = {} if pending is None else {pending.call.id: pending.call.name}
        kinds = input_wait_kinds((i.message for i in inputs), open_calls, self.config.toolset)
        latest = latest_call_kind(history.history, self.config.toolset)
        self._slow_wait = is_slow_wait(kinds if latest is None else {*kinds, latest})
        self._slow_wait = self._slow_wait or is_slow_person(self._person_gap(history, inputs))
        batch = await self._apply_deferral(history, list(inputs))
        passive = frozenset(t.name for t in self.config.toolset if t.passive)
        preparer = Preparer(
            history,
            self.conversation,
            self.state,
            self._effects,
            self.emit,
            passive_tools=passive,
            clock=self.config.clock,
            compaction_lease_seconds=self.config.compaction_lease_seconds,
            toolset=self.config.toolset,
            input_check=self._input_check(history, metadata),
        )
        preparer.pending_choices.extend(await self._choices_if_needed(batch))
        ready = False
        # The last commit left the turn unfinished with nothing pending: a request that had to wait for
        # compaction (see ``_owes_after_compaction``).
        unfinished = history.info is not None and history.info.turn_complete is False and pending is None
        last_ready_id = inputs[-1].message_id if inputs else "redrive"
        saw_duplicate = False
        for item in batch:
            if await history.is_processed(item.message_id):
                saw_duplicate = True
            if await preparer.prepare(item.message, item.message_id):
                ready = True
                last_ready_id = item.message_id
            elif isinstance(item.message.synthetic, CompactionComplete) and unfinished:
                ready = ready or self._owes_after_compaction(history)
        await self._effects.cancel_interrupted(history.take_interrupted_tool_calls())
        if preparer.approved:
            owes_completion = await self._run_approved(history, preparer.approved) or owes_completion

        if not ready and (owes_completion or (saw_duplicate and self._awaits_model(history))):
            ready = True
        if not ready:
            history.turn_complete = turn_is_complete(history, self.config.toolset)
            if any(isinstance(i.message.synthetic, Compaction) for i in batch) and self._awaits_model(
                history
            ):
                history.turn_complete = False  # the answer waits for this compaction
            # A redelivered input: the step that processed it may have died before it asked for the
            # compaction it needed, so ask again (the request's id makes a repeat a no-op).
            request = await self._compaction_request_after_redelivery(history) if saw_duplicate else None
            if request is not None:
                history.turn_complete = False
                await self._effects.finish(StepEnd(compaction_request=request))
            else:
                await self._effects.commit()
            return StepOutcome(self.thread_id)
        refusal = "\n".join(preparer.refused) or None
        return await self._complete_commit_dispatch(history, last_ready_id, refusal)

    def _input_check(
        self, history: HistoryManager, metadata: object
    ) -> Callable[[str], tuple[str, str] | None]:
        """The check of a user's text against the room the window leaves beside the fixed part of a
        request (see :class:`~stepagent.core.prepare.Preparer`): a text that alone cannot fit is not shown.
        One that fits alone but not beside the summary of a compaction is shown with the newest items
        that fit (``core/completion.py``)."""
        room: list[int] = []

        def check(text: str) -> tuple[str, str] | None:
            agent = self._agent(history, metadata)
            window = agent.info.context_window
            if window <= 0:
                return None
            if not room:
                system = self._system_prompt(history, agent)
                info = history.info
                scale = info.estimate_scale if info is not None and info.estimate_scale is not None else 1.0
                specs = agent.toolset.specs()
                room.append(input_room(system, specs, window, output_limit(agent), scale))
            tokens = estimate_item(UserItem(TextContent(text=text)))
            if room[0] <= 0 or tokens <= room[0]:
                return None  # it fits (a window the fixed part fills is reported by the completion)
            chars = len(text)
            stand_in = INPUT_NOT_SHOWN.format(chars=chars, window=window)
            error = INPUT_TOO_LARGE.format(tokens=tokens, chars=chars, window=window, limit=room[0])
            return stand_in, error

        return check

    def _person_gap(self, history: HistoryManager, inputs: Sequence[StepInput]) -> float | None:
        """How long the thread's person took to write after its last turn: measured now when a message of
        theirs ends a finished turn (and recorded on the head with this step's commit), else the
        thread's last measure. The end of every turn then records its time (``HistoryManager.clock``)."""
        history.clock = self.config.clock
        info = history.info
        if info is None:
            return None
        person = any(i.message.is_user_text and i.message.synthetic is None for i in inputs)
        if person and info.turn_complete and info.turn_ended_at is not None:
            history.person_gap = max(0.0, self.config.clock() - info.turn_ended_at)
            return history.person_gap
        return info.person_gap

    def _owes_after_compaction(self, history: HistoryManager) -> bool:
        """Whether the compaction that just completed was what an answer waited for. The step whose
        request could not fit committed an unfinished turn and asked for compaction; the step that started
        the compaction kept the turn unfinished. The summary then either leaves that input visible (the
        history ends awaiting the model) or covers everything (only the summary is left): either way the
        model answers now."""
        items = history.history
        only_summary = len(items) == 1 and isinstance(items[0], Summary)
        return history.compacted_up_to is not None and (only_summary or self._awaits_model(history))

    async def _compaction_request_after_redelivery(
        self, history: HistoryManager
    ) -> tuple[InputMessage, str] | None:
        agent = self._agent(history, history.metadata)
        window = agent.info.context_window
        system = self._system_prompt(history, agent)
        over = self._over_limit(history, agent, system, scale=await self._estimate_scale(history))
        return self._compaction_request(history, None, window, agent.compaction_threshold, over=over)

    @staticmethod
    def _system_prompt(history: HistoryManager, agent: ThreadAgent) -> str:
        return system_prompt(agent.instructions, agent.toolset, root_thread_id=history.root_thread_id)

    async def _estimate_scale(self, history: HistoryManager) -> float:
        """The provider's tokens per estimated token as last measured on this thread (its head), or — for a
        compaction thread before its first measure — on the parent it summarises; ``1.0``: never measured."""
        info = history.info
        if info is None:
            return 1.0
        if info.estimate_scale is None and info.kind == ThreadKind.COMPACTION and info.parent_id is not None:
            parent = await self.conversation.get_thread(info.parent_id)
            info = parent if parent is not None else info
        return info.estimate_scale if info.estimate_scale is not None else 1.0

    @staticmethod
    def _over_limit(history: HistoryManager, agent: ThreadAgent, system: str, *, scale: float = 1.0) -> bool:
        """Whether the thread should compact before its next request: over the threshold's share of the
        window, its estimate scaled by the provider's measured ``scale``, or too near truncation's budget
        (``providers/window.py``) — so compaction always comes before truncation."""
        model = agent.info
        if model.context_window <= 0:
            return False
        output_limit = agent.max_tokens if agent.max_tokens is not None else model.max_output_tokens
        view = model_view(history.history, model.supports_image_input)
        return compaction_helps(
            system,
            agent.toolset.specs(),
            view,
            model.context_window,
            output_limit,
            agent.compaction_threshold,
            scale=scale,
        )

    def _agent(self, history: HistoryManager, metadata: object) -> ThreadAgent:
        config = self.config
        return resolve_agent(
            config.agent,
            config.provider,
            config.toolset,
            config.providers,
            metadata=metadata,
            child=bool(history.ancestors),
        )

    async def _complete_commit_dispatch(
        self, history: HistoryManager, message_id: str, refusal: str | None = None
    ) -> StepOutcome:
        """Run the model (unless ``refusal`` says why it is not called: the turn then ends with that
        error), commit, dispatch, report."""
        agent = self._agent(history, history.metadata)
        model = agent.info
        self.emit(CompletionStarted())
        compaction_thread = history.info is not None and history.info.kind == ThreadKind.COMPACTION
        runner = CompletionRunner(
            needs_approval=agent.needs_approval,
            history=history,
            provider=agent.provider,
            toolset=agent.toolset,
            system_prompt=self._system_prompt(history, agent),
            effects=self._effects,
            emit=self.emit,
            message_id=message_id,
            retry=self.config.retry,
            cancel=self.cancel,
            model_info=model,
            max_tokens=agent.max_tokens,
            temperature=agent.temperature,
            tracer=self.config.tracer,
            limits=Limits(
                agent.max_model_calls_per_turn, agent.max_conversation_tokens, agent.max_conversation_cost_usd
            ),
            cost=lambda usage: self.config.prices.cost(agent.model, usage),
            output_schema=agent.output_schema,
            output_retries=agent.output_retries,
            cache_ttl=choose_ttl(agent.prompt_cache_ttl, slow=self._slow_wait),
            compact_on_overflow=not compaction_thread,
            estimate_scale=await self._estimate_scale(history),
        )
        outcome = CompletionOutcome(refusal=refusal) if refusal is not None else await runner.run()
        intent = None
        if outcome.action is not None:
            call = outcome.action.call
            intent = DispatchIntent(call.id, call.name, call.arguments, call.call_id)
            history.add_intent(intent)
        step_usage = outcome.step_usage or Usage()
        window, threshold = model.context_window, agent.compaction_threshold
        # One estimate decides both compaction and truncation, and compaction comes first.
        over = outcome.refusal is None and (
            outcome.needs_compaction
            or self._over_limit(history, agent, runner.system_prompt, scale=runner.estimate_scale)
        )
        compaction_due = self._compaction_due(history, outcome.usage, window, threshold, over=over)
        history.turn_complete = turn_is_complete(history, self.config.toolset, compaction_due=compaction_due)
        complete = (
            not outcome.cancelled
            and not outcome.needs_compaction
            and not self._held
            and history.pending_tool_call() is None
        )
        cost = self.config.prices.cost(agent.model, step_usage)
        # A limit that stopped the step before any model call: its stop is kept in a record of no usage,
        # once — a redelivery that stops again finds it and commits nothing, re-reporting the same events.
        stopped_early = outcome.limit is not None and not outcome.completions
        kept_before = stopped_early and await self._stop_kept(history, message_id, outcome.limit)
        if stopped_early and not kept_before:
            history.record_usage(
                UsageRecord(step_id=message_id, model=agent.model, turn_complete=complete, cost_usd=cost)
            )
        if not stopped_early:
            history.record_usage(
                UsageRecord(
                    step_id=message_id,
                    model=agent.model,
                    input_tokens=step_usage.input_tokens,
                    output_tokens=step_usage.output_tokens,
                    cache_read_tokens=step_usage.cache_read_tokens,
                    cache_write_tokens=step_usage.cache_write_tokens,
                    completions=outcome.completions,
                    turn_complete=complete,
                    cost_usd=cost,
                    output=json.dumps(outcome.output) if outcome.has_output else None,
                )
            )
        finished = CompletionFinished(
            usage=outcome.usage,
            context_window=model.context_window,
            step_usage=outcome.step_usage,
            model=agent.model,
        )
        waiting = history.waiting_for_approval()
        asked = (
            []
            if waiting is None
            else [ApprovalRequested(waiting.call.name, waiting.call.arguments, waiting.call.id)]
        )
        error = outcome.refusal
        if error is None and outcome.error is not None:
            error = f"The model failed: {outcome.error}"
        if error is None and outcome.output_errors:
            attempts = agent.output_retries + 1
            error = (
                f"The answer did not match the output schema after {attempts} attempt"
                f"{'s' if attempts != 1 else ''}: " + "; ".join(outcome.output_errors)
            )
        failed: list[AgentEvent] = []
        if error is not None:
            failed.append(StepFailed(message=error, retrying=False, source_id=message_id))
        if outcome.limit is not None:
            failed.append(replace(outcome.limit, source_id=message_id))
        # What ended the turn is kept with the thread, in the step's usage record.
        if not kept_before:
            for stopped in failed:
                assert isinstance(stopped, StepFailed | LimitReached)
                history.keep_notice(kept_notice(stopped, message_id))
        request = self._compaction_request(history, outcome.usage, window, threshold, over=over)
        notice = Info(f"✦ Auto-compaction triggered (context > {agent.compaction_threshold:.0%})")
        if outcome.needs_compaction and request is not None:
            notice = Info("✦ The conversation no longer fits the model's context window: compacting it first")
        await self._effects.finish(
            StepEnd(
                sync_calls=outcome.executed_sync_calls,
                observe=[finished, *failed, *asked],
                dispatch=intent,
                compaction_request=request,
                compaction_notice=notice,
            )
        )
        if complete:
            self.emit(
                TurnComplete(
                    usage=step_usage,
                    model=agent.model,
                    step_id=message_id,
                    version=history.version,
                    cost_usd=cost,
                    output=outcome.output,
                    has_output=outcome.has_output,
                )
            )
        return StepOutcome(self.thread_id, True, outcome.usage, model.context_window, error)

    def _compaction_request(
        self,
        history: HistoryManager,
        usage: Usage | None,
        window: int,
        threshold: float = DEFAULT_COMPACTION_THRESHOLD,
        *,
        over: bool = False,
    ) -> tuple[InputMessage, str] | None:
        """The input (and its dedup id) that asks this thread to compact itself, ordered like any other.

        The request's id names what would be compacted (the summary the thread already has) and the lease
        period, so every trigger between two compactions sends the same request: the queue's dedup and the
        thread's processed ids keep all but the first, including a trigger from a step that measured its
        usage before the last summary landed (it reports the old, high usage). Preparing the request takes the
        durable claim (two compactions never overlap); once a lease period has passed without a new
        summary — a compaction child that never finished — the id changes and compaction is tried again."""
        if not self._compaction_due(history, usage, window, threshold, over=over):
            return None
        epoch = int(self.config.clock() // self.config.compaction_lease_seconds)
        covered = str(history.compacted_up_to or 0)
        request_id = derived_id("compaction-request", self.thread_id, covered, str(epoch))
        request = InputMessage(content=TextContent(text=""), group_id=self.thread_id, synthetic=Compaction())
        return request, request_id

    def _compaction_due(
        self,
        history: HistoryManager,
        usage: Usage | None,
        window: int,
        threshold: float,
        *,
        over: bool = False,
    ) -> bool:
        """Whether the thread should compact: its next request's estimate is ``over`` the limit (the
        estimate truncation uses), or the provider reported usage above the threshold."""
        if not over and not should_compact(usage, window, threshold):
            return False
        return history.info is None or history.info.kind != ThreadKind.COMPACTION

    @property
    def _effects(self) -> StepEffects:
        assert self.effects is not None  # built by run() right after the load
        return self.effects

    # ---- outbox -----------------------------------------------------------------------------------------------

    async def _redrive_outbox(self, history: HistoryManager) -> bool:
        """Dispatch intents a previous run committed but did not finish. Returns whether a re-run
        synchronous tool left a result the model has not seen yet."""
        if history.snapshot.open_intents is False:
            return False  # the store knows there are none
        intents = await self.state.open_intents(self.thread_id)
        if not intents:
            return False
        await history.prefetch(tool_call_ids=[i.tool_call_id for i in intents])
        owes_completion = False
        for intent in intents:
            owes_completion = await self._drive_intent(history, intent, redrive=True) or owes_completion
        return owes_completion

    async def _run_approved(self, history: HistoryManager, approved: Sequence[DispatchIntent]) -> bool:
        """Run the calls people approved in this step: first commit the decisions and the calls' intents
        (so the call never runs before its decision is durable, and a crash from here on re-drives the
        intent instead of losing the decision), then drive each intent like a re-driven one."""
        await self._effects.commit()
        owes_completion = False
        for intent in approved:
            owes_completion = await self._drive_intent(history, intent, redrive=False) or owes_completion
        return owes_completion

    async def _drive_intent(self, history: HistoryManager, intent: DispatchIntent, *, redrive: bool) -> bool:
        """Run or dispatch one committed intent (a re-driven one, or a call a person just approved).
        Returns whether a synchronous tool left a result the model has not seen yet."""
        effects = self._effects
        if history.is_answered(intent.tool_call_id):
            await effects.intent_done(intent.tool_call_id)
            return False
        tool = self.config.toolset.get(intent.tool_name)
        if tool is not None and tool.inline:
            pending = history.pending_tool_call()
            if pending is None or pending.call.id != intent.tool_call_id:
                await effects.intent_done(intent.tool_call_id)
                return False
            call = ToolCall(
                id=intent.tool_call_id,
                name=intent.tool_name,
                arguments=intent.arguments,
                call_id=intent.call_id,
            )
            result = await effects.rerun_inline(tool, call)
            history.append_generated(ToolResultItem(result=result), sync_result_id(call.id))
            await effects.commit()
            await effects.intent_done(intent.tool_call_id)
            return True
        if redrive:
            self.emit(Info(f"Re-dispatching tool call {intent.tool_call_id} ({intent.tool_name})"))
        await effects.dispatch(intent)
        return False

    # ---- deferral -----------------------------------------------------------------------------------------------

    async def _apply_deferral(self, history: HistoryManager, batch: list[StepInput]) -> list[StepInput]:
        """The batch in fold-in order: events that must wait for the pending call are held (returned
        without them); once the call is answered, held events follow its result in arrival order, ahead of
        anything that arrived after them."""
        release_at = len(batch)  # where released inputs go: they arrived before everything in this batch
        pending = history.pending_tool_call()
        tool = self.config.toolset.get(pending.call.name) if pending is not None else None
        active = pending is not None and (tool is None or not tool.passive)
        if active and pending is not None:
            pending_id = pending.call.id

            def waits(item: StepInput) -> bool:
                synthetic = item.message.synthetic
                # Inline events wait for the call's result; so does any event of the pending call itself —
                # a subscription's event that overtook its start result cannot be handled before it.
                return is_deferrable_synthetic(synthetic) or (
                    isinstance(synthetic, SubscriptionEvent) and synthetic.tool_call_id == pending_id
                )

            asked = history.waiting_for_approval()
            answers_waiting = asked is not None and asked.call.id == pending_id

            def answers(item: StepInput) -> bool:
                content = item.message.content
                if item.message.synthetic is not None:
                    return False
                if isinstance(content, ToolResult):
                    return content.id == pending_id
                # A person's reject/respond answers a call that waits for them (approve/edit run it).
                return (
                    answers_waiting
                    and isinstance(content, ApprovalDecision)
                    and content.tool_call_id == pending_id
                    and content.decision in ("reject", "respond")
                )

            answer = next((n for n, i in enumerate(batch) if answers(i)), None)
            settled = answer is not None or any(i.message.is_user_text for i in batch)
            if answer is not None:
                # Events that reached this batch before the call's result still wait for it.
                early = batch[:answer]
                waiting = [i for i in early if waits(i)]
                rest = [i for i in early if not waits(i)]
                batch = [*rest, batch[answer], *waiting, *batch[answer + 1 :]]
                release_at = len(rest) + 1
            if not settled:
                kept = []
                for item in batch:
                    if waits(item) and not await history.is_processed(item.message_id):
                        history.defer(DeferredInput(item.message_id, item.message))
                        self._held = True
                    else:
                        kept.append(item)
                return kept
        known_none = history.snapshot.deferred is False
        deferred = [] if known_none else await self.state.deferred_inputs(self.thread_id)
        # One batched dedup read for everything released (a storm of held events is thousands of ids).
        await history.prefetch([d.message_id for d in deferred])
        for held in deferred:
            history.undefer(held.message_id)
        released = [StepInput(d.message, d.message_id) for d in deferred]
        return [*batch[:release_at], *released, *batch[release_at:]]

    # ---- helpers --------------------------------------------------------------------------------------------------

    async def _choices_if_needed(self, batch: Sequence[StepInput]) -> list[UserChoiceRequired]:
        """Pending choices matter only when a tool result may answer one; skip the read otherwise."""
        if self.history is not None and self.history.snapshot.choices is False:
            return []  # the store knows there are none
        if any(isinstance(i.message.content, ToolResult) and i.message.synthetic is None for i in batch):
            return await self.state.pending_choices(self.thread_id)
        return []

    async def _stop_kept(self, history: HistoryManager, message_id: str, limit: LimitReached | None) -> bool:
        """Whether the thread's last commit already kept this step's limit stop (a redelivery of it)."""
        if limit is None or history.version == 0:
            return False
        kept = kept_notice(replace(limit, source_id=message_id), message_id)
        async for record in self.conversation.usage_records(
            self.thread_id, after_version=history.version - 1
        ):
            if (
                record.step_id == message_id
                and record.notices is not None
                and kept in json.loads(record.notices)
            ):
                return True
        return False

    @staticmethod
    def _awaits_model(history: HistoryManager) -> bool:
        return bool(history.history) and isinstance(
            history.history[-1], UserItem | ToolResultItem | EventItem
        )
