"""Folding one input into a thread: the reference's ``prepare_input`` decision procedure, hardened.

Rules, in order (the first that applies decides):

1. already processed (logical message id) → ignored, nothing written (metadata is not rewritten either);
2. ``compaction_complete`` → apply the thread's latest summary in memory; ``compaction`` → spawn a
   compaction child;
3. metadata present → replaces the root's metadata (committed with the step);
4. OAuth / user-choice notices → events (a choice is persisted first); never history;
5. synthetic events → resolved against the original tool call (visible history, then the durable log,
   so compaction cannot orphan them); subscription events must belong to an active subscription, and a
   report must come from a child this thread spawned with that call — anything else is refused with an
   :class:`~stepagent.events.InputRejected` (an ``error`` output event), never dropped silently;
   non-associative events go to a freshly spawned event child; the rest are inlined as a
   ``receive_event__injected`` call/result pair;
6. a person's decision on a call waiting for approval → :func:`~stepagent.core.approval.fold_decision`
   (a call to run goes to :attr:`Preparer.approved`, run by the step after its commit); a tool's question
   to the user and the person's answer → :mod:`stepagent.core.elicitation`, a finished sign-in →
   :mod:`stepagent.core.sign_in` (a resumed call goes to :attr:`Preparer.approved` too);
7. everything else → a ``user`` or ``tool_result`` item through ``HistoryManager.handle_content``.

The preparer decides; every write it needs — a state change, a compaction claim, a child spawned from
committed history — is handed to :class:`~stepagent.core.effects.StepEffects` as a plain value and performed
there (the history's own pending changes are committed by the step). All ids are derived from the input's
logical id, so a re-run after a crash finds the same child and re-sends the same message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stepagent import texts
from stepagent.core.approval import fold_decision
from stepagent.core.effects import (
    AddPendingChoice,
    ChildSpawn,
    ReleaseCompaction,
    RemovePendingChoice,
    StepEffects,
)
from stepagent.core.elicitation import fold_answer, fold_question
from stepagent.core.history import INTERRUPTED_TEXT, HistoryManager
from stepagent.core.sign_in import fold_sign_in
from stepagent.events import (
    AgentEvent,
    CompactionApplied,
    Info,
    InputRejected,
    OAuthRequiredEvent,
    SubscriptionEventReceived,
    ToolResultReceived,
    UserChoiceDismissed,
    UserChoiceRequiredEvent,
    UserInput,
)
from stepagent.history_items import (
    INJECTED_TOOL_NAME,
    EventItem,
    HistoryItem,
    ToolCallItem,
    ToolResultItem,
    UserItem,
)
from stepagent.ids import derived_id
from stepagent.messages import (
    ApprovalDecision,
    Compaction,
    CompactionComplete,
    ElicitationAnswer,
    InputMessage,
    InputRequired,
    OAuthComplete,
    OAuthRequired,
    ParentMessage,
    SubscriptionEvent,
    TextContent,
    ThreadReport,
    ToolCall,
    ToolResult,
    UserChoiceRequired,
)
from stepagent.stores.base import ConversationStore, DispatchIntent, StateStore, ThreadKind
from stepagent.tools.base import Toolset

INTERRUPT_MARKER = "<interrupt>"


@dataclass(slots=True)
class Preparer:
    """Prepares a thread's inputs for one step."""

    history: HistoryManager
    #: Read only here (thread records, subscriptions, the call index); every write goes through ``effects``.
    conversation: ConversationStore
    state: StateStore
    effects: StepEffects
    emit: Callable[[AgentEvent], None]
    pending_choices: list[UserChoiceRequired] = field(default_factory=list)
    #: Tools whose late results (after an interruption answered the call) are still shown, as events.
    passive_tools: frozenset[str] = frozenset()
    clock: Callable[[], float] = time.time
    compaction_lease_seconds: float = 3600.0
    #: Every tool of the deployment (what a person's edit is validated against).
    toolset: Toolset = field(default_factory=Toolset)
    #: Calls people approved in this batch: committed with their intents, run by the step after the commit.
    approved: list[DispatchIntent] = field(default_factory=list)
    #: Says whether a user's text is too large to show the model: ``None`` when it fits, else the text
    #: that stands in for it in history and the error for people (``core/step.py`` builds it).
    input_check: Callable[[str], tuple[str, str] | None] | None = None
    #: The errors of inputs this batch could not show the model (the step ends the turn with them).
    refused: list[str] = field(default_factory=list)
    _subscriptions: set[str] | None = None

    @property
    def thread_id(self) -> str:
        return self.history.thread_id

    async def prepare(self, message: InputMessage, message_id: str) -> bool:
        """Fold ``message`` in; ``True`` when it changed history so the model should respond."""
        history = self.history
        if await history.is_processed(message_id):
            return False
        synthetic = message.synthetic
        if isinstance(synthetic, CompactionComplete | Compaction):
            await self._prepare_compaction(synthetic, message_id)
            return False
        if message.metadata is not None:
            history.update_metadata(message.metadata)
        content = message.content
        if isinstance(content, ApprovalDecision):
            folded = fold_decision(history, content, message_id, self.toolset, self.emit)
            if folded.intent is not None:
                self.approved.append(folded.intent)
            return folded.answered
        if isinstance(content, OAuthRequired | UserChoiceRequired):
            await self._prepare_request_to_user(content, message_id)
            return False
        if isinstance(content, InputRequired):
            await fold_question(history, self.effects, content, message_id, self.emit)
            return False
        if isinstance(content, ElicitationAnswer):
            intent = await fold_answer(history, self.state, self.effects, content, message_id, self.emit)
            if intent is not None:
                self.approved.append(intent)
            return False
        if isinstance(content, OAuthComplete):
            return await self._prepare_sign_in(message, content, message_id)
        if isinstance(synthetic, SubscriptionEvent | ThreadReport | ParentMessage):
            assert isinstance(content, ToolResult)  # guaranteed by InputMessage validation
            return await self._prepare_event(message, synthetic, content, message_id)
        if isinstance(content, ToolResult):
            late = await self._interrupted_passive_call(content.id)
            if late is not None:
                return await self._inline(late, content, message_id, child=None)
        return await self._prepare_content(message, message_id)

    async def _prepare_sign_in(self, message: InputMessage, done: OAuthComplete, message_id: str) -> bool:
        """A finished sign-in: the waiting call is dispatched again (after the commit), or — declined —
        answered with the error the model sees."""
        folded = fold_sign_in(self.history, done, message_id, self.emit)
        if folded.intent is not None:
            self.approved.append(folded.intent)
        if folded.result is None:
            return False
        return await self._prepare_content(message.model_copy(update={"content": folded.result}), message_id)

    async def _prepare_compaction(self, synthetic: Compaction | CompactionComplete, message_id: str) -> None:
        history = self.history
        if isinstance(synthetic, CompactionComplete):
            applied = await history.apply_compaction()
            await self.effects.change(ReleaseCompaction())
            history.record_processed(message_id)
            if applied:
                self.emit(CompactionApplied())
            else:
                self.emit(
                    InputRejected(message_id, "compaction_complete, but this thread has no summary to apply")
                )
            return
        # The durable claim makes compactions of one thread exclusive, across steps and processes;
        # the lease frees it if a compaction child never finishes.
        lease = self.compaction_lease_seconds
        if await self.effects.claim_compaction(message_id, self.clock(), lease):
            await self._spawn_compaction_child(message_id)
        else:
            self.emit(Info("A compaction of this thread is already in progress"))
        history.record_processed(message_id)

    async def _prepare_request_to_user(
        self, content: OAuthRequired | UserChoiceRequired, message_id: str
    ) -> None:
        """An OAuth link or a choice for the user: an output event (a choice is also stored as pending)."""
        if isinstance(content, OAuthRequired):
            self.emit(OAuthRequiredEvent(auth_url=content.auth_url, tool_call_id=content.id))
        else:
            await self.effects.change(AddPendingChoice(content))
            self.pending_choices[:] = [c for c in self.pending_choices if c.id != content.id] + [content]
            self.emit(UserChoiceRequiredEvent(choice=content))
        self.history.record_processed(message_id)

    async def _prepare_content(self, message: InputMessage, message_id: str) -> bool:
        """User content or a tool result, appended to history."""
        content = message.content
        assert not isinstance(
            content,
            OAuthRequired
            | UserChoiceRequired
            | ApprovalDecision
            | InputRequired
            | ElicitationAnswer
            | OAuthComplete,
        )  # the caller's
        item: HistoryItem
        refusal = None
        if isinstance(content, ToolResult):
            item = ToolResultItem(result=content, display_segments=message.display_as)
        else:
            if isinstance(content, TextContent) and self.input_check is not None:
                verdict = self.input_check(content.text)
                if verdict is not None:
                    stand_in, refusal = verdict
                    content = TextContent(text=stand_in)  # history shows what the model is shown
            item = UserItem(content=content)
        if not await self.history.handle_content(item, message_id):
            return False
        if refusal is not None:
            self.refused.append(refusal)
        if message.synthetic is None and not isinstance(content, ToolResult):
            self.history.turn_model_calls = 0  # user input starts a new turn: the per-turn count restarts
        if isinstance(content, ToolResult):
            if message.subscription:
                self.history.pending.subscribe(content.id, self.history.find_tool_call(content.id))
                (await self._active_subscriptions()).add(content.id)  # later inputs of this batch see it
            text = content.first_text()
            if text is not None:
                segments = [*(message.display_as or []), {"type": "text", "content": text}]
                self.emit(ToolResultReceived(segments=segments))
            await self._dismiss_choice(content.id)
        elif isinstance(content, TextContent):
            self.emit(UserInput(text=content.text.removeprefix(INTERRUPT_MARKER).lstrip()))
        return True

    # ---- synthetic events -----------------------------------------------------------------------------

    async def _prepare_event(
        self,
        message: InputMessage,
        synthetic: SubscriptionEvent | ThreadReport | ParentMessage,
        content: ToolResult,
        message_id: str,
    ) -> bool:
        history = self.history
        original_id = synthetic.tool_call_id
        if isinstance(synthetic, SubscriptionEvent) and original_id not in await self._active_subscriptions():
            reason = (
                f"a subscription event for {original_id}, which is not an active subscription of this thread"
            )
            return self._reject(message_id, reason)
        original = await self._find_call(original_id)
        if original is None:
            return self._reject(
                message_id, f"a {synthetic.type} for tool call {original_id}, which is not in this thread"
            )
        if isinstance(synthetic, ThreadReport):
            reporter = await self.conversation.get_thread(synthetic.child_thread_id)
            if (
                reporter is None
                or reporter.parent_id != self.thread_id
                or reporter.spawn_tool_call_id != original_id
            ):
                reason = (
                    f"a thread_report from {synthetic.child_thread_id}, which is not a child this thread "
                    f"spawned with tool call {original_id}"
                )
                return self._reject(message_id, reason)
        if isinstance(synthetic, SubscriptionEvent) and not synthetic.associative:
            await self._route_to_event_child(original, content, message_id)
            if synthetic.final:
                history.pending.unsubscribe(original_id)
                (await self._active_subscriptions()).discard(original_id)
            history.record_processed(message_id)
            return False

        child = synthetic.child_thread_id if isinstance(synthetic, ThreadReport) else None
        if not await self._inline(original, content, message_id, child=child):
            return False
        if isinstance(synthetic, ParentMessage):
            history.turn_model_calls = 0  # a child's user is its parent: a new message starts a new count
        if isinstance(synthetic, SubscriptionEvent) and synthetic.final:
            history.pending.unsubscribe(original_id)
            (await self._active_subscriptions()).discard(original_id)
        return True

    def _reject(self, message_id: str, reason: str) -> bool:
        """Refuse an input that refers to something this thread does not have: recorded as processed (a
        redelivery is refused again cheaply), reported with the reason."""
        refusal = InputRejected(message_id, reason)
        self.history.refuse(refusal)
        self.emit(refusal)
        return False

    async def _inline(
        self, original: ToolCallItem, content: ToolResult, message_id: str, *, child: str | None
    ) -> bool:
        """Append ``content`` as a ``receive_event__injected`` call/result pair attributed to ``original``."""
        invocation_id = derived_id("event", self.thread_id, message_id)
        invocation = ToolCall(
            id=invocation_id,
            name=INJECTED_TOOL_NAME,
            arguments={
                "original_args": original.call.arguments,
                "original_tool_call_id": original.call.id,
                "original_tool_name": original.call.name,
            },
        )
        item = EventItem(
            result=content.with_id(invocation_id, call_id=content.call_id),
            tool_call_id=original.call.id,
            child_thread_id=child,
            invocation=invocation,
        )
        if not await self.history.handle_content(item, message_id):
            return False
        text = content.first_text()
        if text is not None:
            if child is not None:
                name = f"Report from child thread {child}"
            else:
                name = f"{original.call.name}({json.dumps(original.call.arguments, separators=(',', ':'))})"
            self.emit(SubscriptionEventReceived(name=name, text=text))
        return True

    async def _interrupted_passive_call(self, tool_call_id: str) -> ToolCallItem | None:
        """The call, if ``tool_call_id`` names a passive tool's call (a timer) that an interruption
        answered: its late result is news for the model, not a duplicate."""
        original = self.history.find_tool_call(tool_call_id)
        if original is None or original.call.name not in self.passive_tools:
            return None
        for item in self.history.history:
            if isinstance(item, ToolResultItem) and item.result.id == tool_call_id:
                return original if item.result.first_text() == INTERRUPTED_TEXT else None
        return None

    async def _active_subscriptions(self) -> set[str]:
        if self._subscriptions is None:
            self._subscriptions = await self.state.active_subscriptions(self.thread_id)
        return self._subscriptions

    async def _find_call(self, tool_call_id: str) -> ToolCallItem | None:
        """The original call: in the visible history, else in the durable call index of this thread or an
        ancestor (spawn and subscription calls are indexed when committed), which compaction never hides."""
        found = self.history.find_tool_call(tool_call_id)
        if found is not None:
            return found
        for thread_id in reversed(self.history.thread_stack):
            call = await self.state.indexed_call(thread_id, tool_call_id)
            if call is not None:
                return ToolCallItem(call=call)
        return None

    async def _route_to_event_child(self, original: ToolCallItem, event: ToolResult, message_id: str) -> None:
        """Process a non-associative subscription event in a new child that inherits committed history."""
        child_id = derived_id("event-child", self.thread_id, message_id)
        spawn_call_id = derived_id("event-spawn", self.thread_id, message_id)
        event_call_id = derived_id("event-call", self.thread_id, message_id)
        spawn_call = ToolCall(
            id=spawn_call_id,
            name="spawn_thread",
            arguments={"instructions": texts.SUBSCRIPTION_CHILD_SPAWN_INSTRUCTIONS},
        )
        seed = ToolResult.text(
            spawn_call_id, texts.SUBSCRIPTION_CHILD_SEED.format(child=child_id, parent=self.thread_id)
        )
        event_call = ToolCall(
            id=event_call_id,
            name=INJECTED_TOOL_NAME,
            arguments={
                "original_tool_name": original.call.name,
                "original_tool_call_id": original.call.id,
                "original_args": original.call.arguments,
            },
        )
        rows: list[tuple[HistoryItem, str]] = [
            (ToolCallItem(call=spawn_call), f"{spawn_call_id}-spawn-call"),
            (ToolResultItem(result=seed), f"{spawn_call_id}-spawn-result"),
            (ToolCallItem(call=event_call), f"{event_call_id}-event-call"),
        ]
        await self.effects.spawn(
            ChildSpawn(
                child_id=child_id,
                spawn_tool_call_id=original.call.id,
                kind=ThreadKind.SUBSCRIPTION_EVENT,
                spawn_order=self.history.safe_spawn_point(),
                seed=rows,
                answered=[spawn_call_id],
                message=InputMessage.tool_result(child_id, event.with_id(event_call_id)),
                dedup_id=event_call_id,
            )
        )

    async def _spawn_compaction_child(self, message_id: str) -> None:
        child_id = derived_id("compaction-child", self.thread_id, message_id)
        spawn_call_id = derived_id("compaction-call", self.thread_id, message_id)
        begin = ToolCallItem(call=ToolCall(id=spawn_call_id, name=texts.COMPACTION_TOOL_NAME))
        instructions = ToolResult.text(spawn_call_id, texts.COMPACTION_INSTRUCTIONS.format(child=child_id))
        await self.effects.spawn(
            ChildSpawn(
                child_id=child_id,
                spawn_tool_call_id=spawn_call_id,
                kind=ThreadKind.COMPACTION,
                spawn_order=self.history.compaction_point(),
                seed=[(begin, f"{spawn_call_id}-compaction-call")],
                message=InputMessage.tool_result(child_id, instructions),
                dedup_id=spawn_call_id,
            )
        )

    async def _dismiss_choice(self, tool_call_id: str) -> None:
        if any(choice.id == tool_call_id for choice in self.pending_choices):
            await self.effects.change(RemovePendingChoice(tool_call_id))
            self.pending_choices[:] = [c for c in self.pending_choices if c.id != tool_call_id]
            self.emit(UserChoiceDismissed(choice_id=tool_call_id))
