"""One step of one thread: re-drive the outbox → prepare inputs → interruption side effects → complete →
**commit** → observe → dispatch.

This module decides what the step does; it performs no write itself. Every commit, state change, send,
spawn, tool run and dispatch goes through :class:`~stepagent.core.effects.StepEffects` (the seam), whose
docstring holds the durability argument (why no crash loses or duplicates anything) and the order of the
writes. What it relies on here:

- Sync before dispatch: the asynchronous call and its dispatch intent are committed, atomically with the
  step's inputs and rows, before the tool is dispatched (:class:`~stepagent.core.effects.StepEnd`).
- Outbox (``core/outbox.py``): an intent is marked done only after its dispatch; every step first
  re-drives open intents with the same idempotency key (the tool call id), so no crash point leaves an
  unanswered, undispatched call.
- Resume: a redelivered input that is already processed, on a thread whose history still ends with
  something the model has not answered, makes the step run the completion it owes.
- Deferral: while a non-passive tool call is pending, reports/events/parent messages are stored durably
  and delivered after the call's result (user text still interrupts); the order is
  :func:`~stepagent.core.fold_order.fold_order`'s plan.
- Agent: the thread runs as the agent its root's metadata selects (``core/agents.py``); an unknown
  profile rejects the step's inputs before anything is written.
- Usage, structured output and the turn's end: one usage record per step that runs the model, its
  events, the notices kept with it and the closing :class:`~stepagent.events.TurnComplete` are computed
  from the completion's outcome by :func:`~stepagent.core.turn_end.end_of_turn`.
- Limits: before every model call, the thread's model calls since its last user text (on its head) and
  the conversation's spend (with the root's metadata) are checked (``core/limits.py``); a reached limit
  emits :class:`~stepagent.events.LimitReached` after the commit instead of calling the model, then the
  turn completes. The usage record's tokens and cost are added to the root's spend by the same commit.
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
- Compaction and what cannot fit (``core/context_window.py``): a thread compacts before it would
  truncate; a request that would be truncated or cannot fit is not sent: the step asks for compaction
  and keeps the turn open, and the step that applies the summary answers (a redelivered input asks
  again for a compaction a crash lost). The summary never covers the inputs the model has not answered
  yet. A window smaller than the fixed part of a request, and a user message larger than the window
  (kept as a marked stand-in), end the turn with an error (``StepFailed``, not retrying) and no model
  call; no compaction runs for either.
- Prompt cache: the step's requests carry the TTL ``STEPAGENT_PROMPT_CACHE_TTL`` selects
  (:mod:`stepagent.core.cache_ttl`); a turn's end and the gap before the person's next message are
  recorded on the head (``ThreadInfo.turn_ended_at``, ``person_gap``) for ``auto`` to predict from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from stepagent.agent_config import DEFAULT_COMPACTION_THRESHOLD
from stepagent.core.agents import ThreadAgent, resolve_agent
from stepagent.core.cache_ttl import choose_ttl, resumes_slowly
from stepagent.core.completion import CompletionOutcome, CompletionRunner
from stepagent.core.context_window import (
    CompactionRequest,
    awaits_model,
    compaction_due,
    compaction_request,
    estimate_scale,
    input_check,
    over_limit,
    owes_after_compaction,
    thread_system_prompt,
)
from stepagent.core.effects import StepEffects, StepEnd, ToolServices
from stepagent.core.fold_order import PendingCall, fold_order
from stepagent.core.history import HistoryManager
from stepagent.core.outbox import Outbox
from stepagent.core.prepare import Preparer
from stepagent.core.step_config import StepConfig, StepInput, StepOutcome
from stepagent.core.turn import turn_is_complete
from stepagent.core.turn_end import end_of_turn, stop_kept
from stepagent.events import AgentEvent, CompletionStarted, Info, Observer
from stepagent.messages import (
    ApprovalDecision,
    Compaction,
    CompactionComplete,
    ToolResult,
    UserChoiceRequired,
)
from stepagent.providers.base import Usage
from stepagent.stores.base import ConversationStore, DeferredInput, DispatchIntent, StateStore

__all__ = ["StepConfig", "StepInput", "StepOutcome", "ThreadStep"]


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
        history = await self._load(inputs)
        # An unknown profile rejects the inputs before anything is written (or dispatched).
        metadata = history.metadata
        for item in inputs:
            if item.message.metadata is not None:
                metadata = item.message.metadata
        self._agent(history, metadata)

        outbox = Outbox(history, self.state, self.config.toolset, self._effects, self.emit)
        owes_completion = await outbox.redrive()
        if history.info is not None and history.info.closed:
            history.turn_complete = True
            await self._effects.commit()
            return StepOutcome(self.thread_id)

        # The last commit left the turn unfinished with nothing pending: a request that had to wait for
        # compaction (see ``owes_after_compaction``).
        info = history.info
        unfinished = info is not None and info.turn_complete is False and history.pending_tool_call() is None
        messages = [i.message for i in inputs]
        self._slow_wait = resumes_slowly(history, messages, self.config.toolset, self.config.clock)
        batch = await self._apply_deferral(history, list(inputs))
        preparer = self._preparer(history, metadata)
        preparer.pending_choices.extend(await self._choices_if_needed(batch))
        ready, saw_duplicate = False, False
        last_ready_id = inputs[-1].message_id if inputs else "redrive"
        for item in batch:
            if await history.is_processed(item.message_id):
                saw_duplicate = True
            if await preparer.prepare(item.message, item.message_id):
                ready, last_ready_id = True, item.message_id
            elif isinstance(item.message.synthetic, CompactionComplete) and unfinished:
                ready = ready or owes_after_compaction(history)
        await self._effects.cancel_interrupted(history.take_interrupted_tool_calls())
        if preparer.approved:
            owes_completion = await outbox.run_approved(preparer.approved) or owes_completion

        if not ready and not owes_completion and not (saw_duplicate and awaits_model(history)):
            await self._end_without_model(history, batch, redelivered=saw_duplicate)
            return StepOutcome(self.thread_id)
        refusal = "\n".join(preparer.refused) or None
        return await self._complete_commit_dispatch(history, last_ready_id, refusal)

    async def _load(self, inputs: Sequence[StepInput]) -> HistoryManager:
        """Read the thread (one snapshot, the batch's dedup questions answered with it) and build the seam."""
        # Calls the batch answers or decides: whether each is answered comes with the thread's first read.
        tool_result_ids = [
            content.id if isinstance(content, ToolResult) else content.tool_call_id
            for i in inputs
            if isinstance(content := i.message.content, ToolResult | ApprovalDecision)
        ]
        config = self.config
        history = self.history = await HistoryManager.load(
            self.conversation,
            self.state,
            self.thread_id,
            message_ids=[i.message_id for i in inputs],
            tool_call_ids=tool_result_ids,
            cache=config.thread_cache,
        )
        await history.prefetch([i.message_id for i in inputs], tool_result_ids)
        services = ToolServices(
            sender=config.sender,
            callback_url=config.callback_url,
            timers=config.timers,
            runner=config.runner,
            notifier=config.notifier,
        )
        self.effects = StepEffects(
            history,
            self.conversation,
            self.state,
            services=services,
            toolset=config.toolset,
            emit=self.emit,
            tracer=config.tracer,
        )
        return history

    def _preparer(self, history: HistoryManager, metadata: object) -> Preparer:
        config = self.config
        return Preparer(
            history,
            self.conversation,
            self.state,
            self._effects,
            self.emit,
            passive_tools=frozenset(t.name for t in config.toolset if t.passive),
            clock=config.clock,
            compaction_lease_seconds=config.compaction_lease_seconds,
            toolset=config.toolset,
            input_check=input_check(history, lambda: self._agent(history, metadata)),
        )

    async def _end_without_model(
        self, history: HistoryManager, batch: Sequence[StepInput], *, redelivered: bool
    ) -> None:
        """Commit a step that calls no model (nothing awaits an answer, or it waits for a compaction)."""
        history.turn_complete = turn_is_complete(history, self.config.toolset)
        if any(isinstance(i.message.synthetic, Compaction) for i in batch) and awaits_model(history):
            history.turn_complete = False  # the answer waits for this compaction
        # A redelivered input: the step that processed it may have died before it asked for the
        # compaction it needed, so ask again (the request's id makes a repeat a no-op).
        request = await self._compaction_request_after_redelivery(history) if redelivered else None
        if request is not None:
            history.turn_complete = False
            await self._effects.finish(StepEnd(compaction_request=request))
        else:
            await self._effects.commit()

    async def _complete_commit_dispatch(
        self, history: HistoryManager, message_id: str, refusal: str | None = None
    ) -> StepOutcome:
        """Run the model (unless ``refusal`` says why it is not called: the turn then ends with that
        error), commit, dispatch, report."""
        agent, config = self._agent(history, history.metadata), self.config
        self.emit(CompletionStarted())
        runner = await self._runner(history, agent, message_id)
        outcome = CompletionOutcome(refusal=refusal) if refusal is not None else await runner.run()
        intent = None
        if outcome.action is not None:
            call = outcome.action.call
            intent = DispatchIntent(call.id, call.name, call.arguments, call.call_id)
            history.pending.add_intent(intent)
        window = agent.info.context_window
        # One estimate decides both compaction and truncation, and compaction comes first.
        over = outcome.refusal is None and (
            outcome.needs_compaction
            or over_limit(history, agent, runner.system_prompt, scale=runner.estimate_scale)
        )
        threshold = agent.compaction_threshold
        due = compaction_due(history, outcome.usage, window, threshold, over=over)
        history.turn_complete = turn_is_complete(history, config.toolset, compaction_due=due)
        end = end_of_turn(
            outcome,
            step_id=message_id,
            model=agent.model,
            context_window=window,
            output_retries=agent.output_retries,
            complete=not (outcome.cancelled or outcome.needs_compaction or self._held)
            and history.pending_tool_call() is None,
            cost=config.prices.cost(agent.model, outcome.step_usage or Usage()),
            stop_kept=await stop_kept(self.conversation, history, message_id, outcome),
            waiting=history.waiting_for_approval(),
        )
        if end.usage is not None:
            history.pending.record_usage(end.usage)
        for kept in end.notices:
            history.pending.keep_notice(kept)
        notice = Info(f"✦ Auto-compaction triggered (context > {agent.compaction_threshold:.0%})")
        if outcome.needs_compaction and due:
            notice = Info("✦ The conversation no longer fits the model's context window: compacting it first")
        await self._effects.finish(
            StepEnd(
                sync_calls=outcome.executed_sync_calls,
                observe=end.observe,
                dispatch=intent,
                compaction_request=self._compaction_request(
                    history, outcome.usage, window, threshold, over=over
                ),
                compaction_notice=notice,
            )
        )
        if (done := end.turn_complete(history.version)) is not None:
            self.emit(done)
        return StepOutcome(self.thread_id, True, outcome.usage, window, end.error)

    async def _runner(self, history: HistoryManager, agent: ThreadAgent, message_id: str) -> CompletionRunner:
        """The model rounds of this step, as ``agent``, answering ``message_id``."""
        config = self.config
        return CompletionRunner(
            agent,
            history,
            self._effects,
            self.emit,
            message_id,
            retry=config.retry,
            cancel=self.cancel,
            tracer=config.tracer,
            prices=config.prices,
            cache_ttl=choose_ttl(agent.prompt_cache_ttl, slow=self._slow_wait),
            estimate_scale=await estimate_scale(self.conversation, history),
        )

    def _compaction_request(
        self,
        history: HistoryManager,
        usage: Usage | None,
        window: int,
        threshold: float = DEFAULT_COMPACTION_THRESHOLD,
        *,
        over: bool = False,
    ) -> CompactionRequest | None:
        """The request that asks this thread to compact itself, if compaction is due (both decided by
        ``core/context_window.py``)."""
        if not compaction_due(history, usage, window, threshold, over=over):
            return None
        config = self.config
        return compaction_request(history, now=config.clock(), lease_seconds=config.compaction_lease_seconds)

    async def _compaction_request_after_redelivery(self, history: HistoryManager) -> CompactionRequest | None:
        agent = self._agent(history, history.metadata)
        scale = await estimate_scale(self.conversation, history)
        over = over_limit(history, agent, thread_system_prompt(history, agent), scale=scale)
        return self._compaction_request(
            history, None, agent.info.context_window, agent.compaction_threshold, over=over
        )

    @property
    def _effects(self) -> StepEffects:
        assert self.effects is not None  # built by run() right after the load
        return self.effects

    # ---- deferral -----------------------------------------------------------------------------------------------

    async def _apply_deferral(self, history: HistoryManager, batch: list[StepInput]) -> list[StepInput]:
        """The batch in fold-in order (``core/fold_order.py``): inputs the plan holds are deferred (unless
        already processed); once the call is answered, inputs held earlier are released where it says."""
        plan = fold_order(batch, self._pending_call(history))
        if plan.release_at is None:
            kept = []
            for n, item in enumerate(plan.inputs):
                if n in plan.hold and not await history.is_processed(item.message_id):
                    history.pending.defer(DeferredInput(item.message_id, item.message))
                    self._held = True
                else:
                    kept.append(item)
            return kept
        known_none = history.snapshot.deferred is False
        deferred = [] if known_none else await self.state.deferred_inputs(self.thread_id)
        # One batched dedup read for everything released (a storm of held events is thousands of ids).
        await history.prefetch([d.message_id for d in deferred])
        for held in deferred:
            history.pending.undefer(held.message_id)
        released = [StepInput(d.message, d.message_id) for d in deferred]
        return [*plan.inputs[: plan.release_at], *released, *plan.inputs[plan.release_at :]]

    def _pending_call(self, history: HistoryManager) -> PendingCall | None:
        """The thread's pending call, if non-passive (a passive call holds nothing back)."""
        pending = history.pending_tool_call()
        if pending is None:
            return None
        tool = self.config.toolset.get(pending.call.name)
        if tool is not None and tool.passive:
            return None
        asked = history.waiting_for_approval()
        return PendingCall(
            pending.call.id, waits_for_person=asked is not None and asked.call.id == pending.call.id
        )

    # ---- helpers --------------------------------------------------------------------------------------------------

    async def _choices_if_needed(self, batch: Sequence[StepInput]) -> list[UserChoiceRequired]:
        """Pending choices matter only when a tool result may answer one; skip the read otherwise."""
        if self.history is not None and self.history.snapshot.choices is False:
            return []  # the store knows there are none
        if any(isinstance(i.message.content, ToolResult) and i.message.synthetic is None for i in batch):
            return await self.state.pending_choices(self.thread_id)
        return []

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
