"""The seam: every write one step makes — commits, state changes, sends, spawns, tool runs and dispatches —
is performed here, in the order that makes a crash at any point lose and duplicate nothing.

The phases decide: preparation folds inputs (``core/prepare.py``), the completion runs model rounds
(``core/completion.py``), the step picks what to re-drive, defer and finish (``core/step.py``). What they
decide is either a pending change of the :class:`~stepagent.core.history.HistoryManager` (rows, processed
ids, answered calls, intents, subscriptions, deferrals, metadata, usage: all committed together) or a plain
value handed to :class:`StepEffects` — a :class:`ChildSpawn`, a :class:`StateChange`, a :class:`StepEnd`.
No other module of ``core/`` calls a store's write method, sends a message, runs a tool or commits the
history (``HistoryManager.sync`` itself is the commit's single writer and is called only from here);
``tests/unit/test_effects_seam.py`` fails if one does. Tools get :class:`StoreToolAccess`, a narrow
capability without the commit, the processed ids, the intents or the choices, so a tool cannot write a
thread's history behind the step's back.

The durability argument (no crash at any point loses or duplicates anything), all of it in this file:

- **Atomic commit (2).** :meth:`StepEffects.commit` and :meth:`StepEffects.checkpoint` write everything
  pending as one ``Commit`` conditioned on the loaded head version; a concurrent writer makes it raise
  (5), and the step is retried from a fresh load. Nothing else here writes history rows.
- **Sync before dispatch (1).** A synchronous tool runs only after :meth:`run_inline`'s checkpoint has
  committed its call and its intent; :meth:`finish` dispatches an asynchronous call only after the commit
  holding it and its intent; a child is created (:meth:`spawn`) only after the parent's history it
  inherits is committed.
- **Outbox (3).** An intent is marked done only after its dispatch (:meth:`dispatch`) or after the
  commit that holds its synchronous result (:meth:`finish`, and the step's re-drive). A crash anywhere in
  between leaves it open; the next step re-drives it with the same idempotency key (the tool call id).
- **Approval.** A call that waits for a person is committed with no intent, so nothing can dispatch it;
  a person's ``approve``/``edit`` is committed (a decision row) together with the call's intent before
  the step drives that intent (:meth:`commit`, then :meth:`dispatch` or :meth:`rerun_inline`), so the
  outbox argument above covers it: never run before the decision is durable, one idempotency key.
- **Redelivery is harmless (4).** Every message sent here carries a dedup id derived from the input or
  call it answers; a spawn is idempotent by its derived child id and seeds only a child that is still
  empty (a concurrent re-run's identical seed is absorbed).
- **State writes outside the commit** are each idempotent and placed where a crash after them is
  harmless: a pending choice is stored before the commit records its notice processed (a redelivery
  stores it again); removing a choice, releasing a compaction claim and marking an intent done can all be
  repeated; a compaction claim is taken before the child it admits is spawned, under the request's own id,
  so a re-run holds it again.
- **No silent loss (6).** Transient errors propagate from every method; only a tool's own failure
  becomes its result (the model sees it). Notifying tool servers of interrupted calls is best effort by
  contract.

Order of one step's writes: open intents re-driven → inputs prepared (state changes, checkpoints and
spawns as they are decided) → interrupted calls cancelled → calls approved in this step (commit, then
each driven like a re-driven intent) → model rounds (checkpoint before each
synchronous tool) → :meth:`finish`: commit → intents of synchronous calls done → observe → dispatch →
intent done → compaction request.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from stepagent import texts
from stepagent.core.history import HistoryManager
from stepagent.errors import ConcurrentWriteError, ToolError, TransientError
from stepagent.events import AgentEvent, Info, TurnCommitted, UserChoiceDismissed
from stepagent.history_items import HistoryItem, Summary
from stepagent.messages import InputMessage, ToolCall, ToolResult, UserChoiceRequired
from stepagent.senders.base import InputSender
from stepagent.stores.base import (
    Commit,
    ConversationStore,
    DispatchIntent,
    StateStore,
    ThreadInfo,
    ThreadKind,
)
from stepagent.tools.base import (
    FunctionRunner,
    LifecycleNotifier,
    TimerBackend,
    Tool,
    ToolContext,
    ToolEffects,
    Toolset,
)
from stepagent.tracing import AttributeValue, Tracer, capture_content, tool_attributes, traced

log = logging.getLogger(__name__)


# ---- what the phases decide ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChildSpawn:
    """A child thread a step creates from its committed history: the record, the rows it starts with
    (written only while the child is still empty) and the first message it receives."""

    child_id: str
    spawn_tool_call_id: str
    kind: ThreadKind
    spawn_order: int
    seed: list[tuple[HistoryItem, str]]
    message: InputMessage
    dedup_id: str
    answered: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class AddPendingChoice:
    """Store a choice the user is asked to make (until a tool result answers it)."""

    choice: UserChoiceRequired


@dataclass(frozen=True, slots=True)
class RemovePendingChoice:
    """Forget a choice: it was answered, or the call that asked it was interrupted."""

    choice_id: str


@dataclass(frozen=True, slots=True)
class ReleaseCompaction:
    """Free the thread's compaction claim (its compaction finished)."""


@dataclass(frozen=True, slots=True)
class PutPendingQuestion:
    """Store (replace) a tool's question to the user, or its answer, under ``key`` until ``expires_at``
    (``core/elicitation.py``); idempotent, so a re-run writes the same value again."""

    key: str
    value: str
    expires_at: float


StateChange = AddPendingChoice | RemovePendingChoice | ReleaseCompaction | PutPendingQuestion


@dataclass(slots=True)
class StepEnd:
    """What a step that ran the model leaves to do after its rows are decided, performed by
    :meth:`StepEffects.finish` in this order: commit, mark ``sync_calls``' intents done, emit ``observe``,
    dispatch ``dispatch``, send ``compaction_request`` (then emit ``compaction_notice``)."""

    sync_calls: Sequence[str] = ()
    observe: Sequence[AgentEvent] = ()
    dispatch: DispatchIntent | None = None
    compaction_request: tuple[InputMessage, str] | None = None
    compaction_notice: AgentEvent | None = None


@dataclass(frozen=True, slots=True)
class ToolServices:
    """What tool contexts are built with besides the stores (all optional but the sender)."""

    sender: InputSender
    callback_url: str | None = None
    timers: TimerBackend | None = None
    runner: FunctionRunner | None = None
    notifier: LifecycleNotifier | None = None


# ---- the tools' capability -----------------------------------------------------------------------------------


class StoreToolAccess:
    """:class:`~stepagent.tools.base.ToolAccess` over the stores: thread records, spawning and closing,
    summaries, subscriptions and the key/value cache — never a commit, processed ids, intents or choices.

    Given the running thread's ``history``, a summary handed to its parent gets the call-id filter of what
    it hides (:meth:`~stepagent.core.history.HistoryManager.inherited_call_ids`: a compaction child holds
    exactly that prefix, so no read is needed); a summary it cannot vouch for is saved without one."""

    def __init__(
        self, conversation: ConversationStore, state: StateStore, history: HistoryManager | None = None
    ) -> None:
        self._conversation = conversation
        self._state = state
        self._history = history

    async def get_thread(self, thread_id: str) -> ThreadInfo | None:
        return await self._conversation.get_thread(thread_id)

    async def spawn_thread(
        self, parent_id: str, *, child_id: str, spawn_tool_call_id: str, kind: ThreadKind
    ) -> ThreadInfo:
        return await self._conversation.spawn_thread(
            parent_id, child_id=child_id, spawn_tool_call_id=spawn_tool_call_id, kind=kind
        )

    async def close_thread(self, thread_id: str) -> None:
        await self._conversation.close_thread(thread_id)

    async def save_summary(self, thread_id: str, summary: Summary) -> None:
        if summary.call_ids is None and self._history is not None:
            call_ids = self._history.inherited_call_ids(thread_id, summary.up_to_order)
            summary = replace(summary, call_ids=call_ids)
        await self._conversation.save_summary(thread_id, summary)

    async def active_subscriptions(self, thread_id: str) -> set[str]:
        return await self._state.active_subscriptions(thread_id)

    async def remove_subscription(self, thread_id: str, tool_call_id: str) -> None:
        await self._state.remove_subscription(thread_id, tool_call_id)

    async def cache_put(self, key: str, value: str, expires_at: float) -> None:
        await self._state.cache_put(key, value, expires_at)

    async def cache_get(self, key: str) -> str | None:
        """A value of the key/value cache (an MCP call held open reads the person's answer here)."""
        return await self._state.cache_get(key)


# ---- running tools -------------------------------------------------------------------------------------------


async def run_inline_tool(tool: Tool, call: ToolCall, context: ToolContext) -> ToolResult:
    """Run a synchronous tool; failures the model should see become ``Error: ...`` results. Transient
    infrastructure errors propagate so the step is retried."""
    try:
        result = await tool.execute(call.arguments, context)
    except TransientError:
        raise
    except ToolError as error:
        return ToolResult.text(call.id, f"Error: {error}", call_id=call.call_id)
    except Exception as error:  # a user tool's bug must reach the model, not kill the thread
        return ToolResult.text(call.id, texts.DISPATCH_FAILED.format(error=error), call_id=call.call_id)
    if result is None:
        return ToolResult.text(
            call.id, f"Error: synchronous tool '{tool.name}' returned no result", call_id=call.call_id
        )
    return result.with_id(call.id, call_id=call.call_id)


def apply_tool_effects(history: HistoryManager, context: ToolContext) -> None:
    """Queue a synchronous tool's state changes for the commit that holds its result."""
    if context.effects is not None:
        for subscription in context.effects.subscriptions_removed:
            history.pending.unsubscribe(subscription)


# ---- the performer -------------------------------------------------------------------------------------------


class StepEffects:
    """Performs one step's writes for one thread (see the module docstring for the order and why)."""

    def __init__(
        self,
        history: HistoryManager,
        conversation: ConversationStore,
        state: StateStore,
        *,
        services: ToolServices,
        toolset: Toolset,
        emit: Callable[[AgentEvent], None],
        tracer: Tracer | None = None,
    ) -> None:
        self.history = history
        self.conversation = conversation
        self.state = state
        self.services = services
        self.toolset = toolset
        self.emit = emit
        self.tracer = tracer
        self.access = StoreToolAccess(conversation, state, history)
        self._reported_rows = 0  # how many of history.committed_rows a TurnCommitted has reported

    @property
    def thread_id(self) -> str:
        return self.history.thread_id

    # ---- commits -------------------------------------------------------------------------------------------

    async def commit(self) -> None:
        """Commit everything pending and report every row committed since the last report."""
        history = self.history
        if history.info is None and not history.pending.rows:
            return  # never create a thread record just to remember dropped inputs
        await history.sync()
        # Report from the last reported row, not from before this sync: rows committed mid-step (before
        # a synchronous tool runs, or before a child is spawned) are reported here too.
        if len(history.committed_rows) > self._reported_rows:
            self.emit(TurnCommitted(rows=history.committed_rows[self._reported_rows :]))
            self._reported_rows = len(history.committed_rows)

    async def checkpoint(self) -> None:
        """Commit everything pending before I/O that depends on it (reported by the next :meth:`commit`)."""
        await self.history.sync()

    # ---- state changes outside the commit ------------------------------------------------------------------

    async def change(self, change: StateChange) -> None:
        match change:
            case AddPendingChoice(choice=choice):
                await self.state.add_pending_choice(self.thread_id, choice)
            case RemovePendingChoice(choice_id=choice_id):
                await self.state.remove_pending_choice(self.thread_id, choice_id)
            case ReleaseCompaction():
                await self.state.release_compaction(self.thread_id)
            case PutPendingQuestion(key=key, value=value, expires_at=expires_at):
                await self.state.cache_put(key, value, expires_at)

    async def claim_compaction(self, claim_id: str, now: float, lease_seconds: float) -> bool:
        """Take the thread's compaction claim (``False``: another compaction holds it)."""
        return await self.state.claim_compaction(self.thread_id, claim_id, now, lease_seconds)

    async def intent_done(self, tool_call_id: str) -> None:
        await self.state.mark_intent_done(self.thread_id, tool_call_id)

    async def cancel_interrupted(self, call_ids: Sequence[str]) -> None:
        """Tell tool servers (best effort) that these calls were interrupted and forget their choices."""
        notifier = self.services.notifier
        for call_id in call_ids:
            if notifier is not None:
                try:
                    await notifier.cancel_tool_call(self.thread_id, call_id)
                except Exception:  # best effort: the call's result is ignored either way
                    log.warning("could not notify tool servers of interrupted call %s", call_id)
            await self.change(RemovePendingChoice(call_id))
            self.emit(UserChoiceDismissed(choice_id=call_id))

    # ---- messages and children -----------------------------------------------------------------------------

    async def send(self, message: InputMessage, dedup_id: str) -> None:
        await self.services.sender.send(message, dedup_id)

    async def spawn(self, spawn: ChildSpawn) -> None:
        """Create a child from committed history: commit, record, seed (a new child only), first message."""
        await self.checkpoint()
        child = await self.conversation.spawn_thread(
            self.thread_id,
            child_id=spawn.child_id,
            spawn_tool_call_id=spawn.spawn_tool_call_id,
            kind=spawn.kind,
            spawn_order=spawn.spawn_order,
        )
        if child.version == 0:  # otherwise an earlier run of this step seeded it
            # A concurrent re-run of this step may have seeded it with the same rows first.
            with contextlib.suppress(ConcurrentWriteError):
                seed = Commit(expected_version=0, rows=spawn.seed, answered_tool_calls=spawn.answered)
                await self.conversation.commit(child.thread_id, seed)
        await self.send(spawn.message, spawn.dedup_id)

    # ---- tools ---------------------------------------------------------------------------------------------

    def context(self, tool_call_id: str, call_id: str | None) -> ToolContext:
        """What a tool sees when it runs for ``tool_call_id`` in this thread."""
        history, services = self.history, self.services
        metadata = history.metadata
        user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
        return ToolContext(
            thread_id=self.thread_id,
            tool_call_id=tool_call_id,
            call_id=call_id,
            thread_stack=history.thread_stack,
            sender=services.sender,
            access=self.access,
            user_id=user_id if isinstance(user_id, str) else None,
            callback_url=services.callback_url,
            timers=services.timers,
            runner=services.runner,
            notifier=services.notifier,
            effects=ToolEffects(),
        )

    def _tool_attributes(self, name: str, tool_call_id: str, arguments: object) -> dict[str, AttributeValue]:
        if self.tracer is None:
            return {}
        attributes = tool_attributes(name, tool_call_id, self.thread_id)
        if capture_content(self.tracer):
            attributes["gen_ai.tool.call.arguments"] = json.dumps(arguments, ensure_ascii=False, default=str)
        return attributes

    async def run_inline(self, tool: Tool, call: ToolCall) -> ToolResult:
        """Commit the call and its intent, then run the synchronous tool; its state changes join the
        commit that will hold its result."""
        await self.checkpoint()
        annotations = self._tool_attributes(call.name, call.id, call.arguments)
        context = self.context(call.id, call.call_id)
        async with traced(self.tracer, f"execute_tool {call.name}", annotations) as span:
            result = await run_inline_tool(tool, call, context)
            if capture_content(self.tracer):
                span.set_attributes({"gen_ai.tool.call.result": result.joined_text()})
        apply_tool_effects(self.history, context)
        return result

    async def rerun_inline(self, tool: Tool, call: ToolCall) -> ToolResult:
        """Run a re-driven synchronous tool again (its call and intent are already committed)."""
        context = self.context(call.id, call.call_id)
        result = await run_inline_tool(tool, call, context)
        apply_tool_effects(self.history, context)
        return result

    async def dispatch(self, intent: DispatchIntent) -> None:
        """Dispatch a committed asynchronous call, then mark its intent done. Failures the model should know
        about become its result; transient infrastructure errors propagate (the intent stays open and is
        re-driven)."""
        context = self.context(intent.tool_call_id, intent.call_id)
        context.resume = intent.resume
        tool = self.toolset.get(intent.tool_name)
        annotations = self._tool_attributes(intent.tool_name, intent.tool_call_id, intent.arguments)
        try:
            if tool is None:
                raise ToolError(f"tool '{intent.tool_name}' is no longer available")
            async with traced(self.tracer, f"execute_tool {intent.tool_name}", annotations):
                await tool.execute(intent.arguments, context)
        except TransientError:
            raise
        except ToolError as error:
            await context.send_result(f"Error: {error}")
        except Exception as error:  # a tool's bug must reach the model, not wedge the thread
            log.exception("tool %s failed to dispatch", intent.tool_name)
            await context.send_result(texts.DISPATCH_FAILED.format(error=error))
            self.emit(Info(f"Error: {error}"))
        await self.intent_done(intent.tool_call_id)

    async def finish(self, end: StepEnd) -> None:
        """The end of a step that ran the model: commit → observe → dispatch → compaction request."""
        await self.commit()
        for call_id in end.sync_calls:
            await self.intent_done(call_id)
        for event in end.observe:
            self.emit(event)
        if end.dispatch is not None:
            await self.dispatch(end.dispatch)
        if end.compaction_request is not None:
            await self.send(*end.compaction_request)
            if end.compaction_notice is not None:
                self.emit(end.compaction_notice)
