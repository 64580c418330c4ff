"""The outbox: how a step drives the dispatch intents the thread has committed.

What it guarantees:

- **Re-driven, never lost.** An intent is marked done only after its dispatch, and every step first
  re-drives the thread's open intents (:meth:`Outbox.redrive`) with the same idempotency key (the tool
  call id), so no crash point leaves an unanswered, undispatched call. An intent whose call is already
  answered is only marked done.
- **Inline calls re-run in place.** An inline (synchronous) tool's intent is re-run only while its call is
  still the thread's pending one; its result is committed before the intent is marked done, and the
  step is told the model owes an answer.
- **Decisions before runs.** Calls a person approved in this step (:meth:`Outbox.run_approved`) run only
  after the decisions and the calls' intents are committed, then exactly like re-driven intents.

Every write goes through :class:`~stepagent.core.effects.StepEffects`; the only read is the open intents.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stepagent.core.completion import sync_result_id
from stepagent.core.effects import StepEffects
from stepagent.core.history import HistoryManager
from stepagent.events import AgentEvent, Info
from stepagent.history_items import ToolResultItem
from stepagent.messages import ToolCall
from stepagent.stores.base import DispatchIntent, StateStore
from stepagent.tools.base import Toolset


class Outbox:
    """One step's driver of one thread's committed intents (see the module docstring)."""

    def __init__(
        self,
        history: HistoryManager,
        state: StateStore,
        toolset: Toolset,
        effects: StepEffects,
        emit: Callable[[AgentEvent], None],
    ) -> None:
        self.history = history
        self.state = state
        self.toolset = toolset
        self.effects = effects
        self.emit = emit

    async def redrive(self) -> bool:
        """Dispatch intents a previous run committed but did not finish. Returns whether a re-run
        synchronous tool left a result the model has not seen yet."""
        history = self.history
        if history.snapshot.open_intents is False:
            return False  # the store knows there are none
        intents = await self.state.open_intents(history.thread_id)
        if not intents:
            return False
        await history.prefetch(tool_call_ids=[i.tool_call_id for i in intents])
        owes_completion = False
        for intent in intents:
            owes_completion = await self.drive(intent, redrive=True) or owes_completion
        return owes_completion

    async def run_approved(self, approved: Sequence[DispatchIntent]) -> bool:
        """Run the calls people approved in this step: first commit the decisions and the calls' intents
        (so the call never runs before its decision is durable, and a crash from here on re-drives the
        intent instead of losing the decision), then drive each intent like a re-driven one."""
        await self.effects.commit()
        owes_completion = False
        for intent in approved:
            owes_completion = await self.drive(intent, redrive=False) or owes_completion
        return owes_completion

    async def drive(self, intent: DispatchIntent, *, redrive: bool) -> bool:
        """Run or dispatch one committed intent (a re-driven one, or a call a person just approved).
        Returns whether a synchronous tool left a result the model has not seen yet."""
        history, effects = self.history, self.effects
        if history.is_answered(intent.tool_call_id):
            await effects.intent_done(intent.tool_call_id)
            return False
        tool = self.toolset.get(intent.tool_name)
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
