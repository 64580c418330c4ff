"""Step mode: ``AgentSystem.step(batch)`` — one batch of input messages, stepped in process (the testing
harness and embedders use it; the queue worker, :mod:`stepagent.aws.worker`, runs the same
:class:`~stepagent.core.step.ThreadStep` per thread itself).

A batch is grouped by thread (first-appearance order of threads, arrival order within a thread); the
threads run concurrently, each as one :class:`~stepagent.core.step.ThreadStep`. A thread's failure is
reported for that thread only: the other threads' steps run to completion (each commit is atomic, so
nothing is ever left half-written), and the caller decides per thread what to retry.

Each thread's step is one ``invoke_agent`` span (with a tracer configured): the child of the trace context
its inputs arrived with (:func:`trace_of`), annotated with the conversation (root thread) and the agent
(the profile, else ``stepagent``) once the step has loaded the thread. One turn is one flat trace:

- the step that starts a turn (a person's text, or nothing carrying a context) is the turn's anchor: what
  it sends carries its own span's context (:func:`stepagent.tracing.carrying_turn`), so every later step,
  tool run and child step of the turn hangs under that span, as siblings;
- a step that ends waiting for a person's decision remembers the turn's context in the state store's cache
  (:func:`turn_trace_key`, only with a tracer); the step the decision starts — its input carries no
  context — continues that turn instead of starting a trace of its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stepagent.agent_config import profile_name
from stepagent.core.step import StepConfig, StepInput, StepOutcome, ThreadStep
from stepagent.events import EventCollector, Observer
from stepagent.messages import InputMessage, TextContent
from stepagent.stores.base import ConversationStore, StateStore
from stepagent.tracing import Span, carrying_turn, continuing, step_attributes, traced

log = logging.getLogger(__name__)

#: How long a turn waiting for a person's decision remembers its trace (a decision after that starts a new
#: trace; the conversation itself is not affected).
TURN_TRACE_TTL_S = 7 * 24 * 3600


@dataclass(frozen=True, slots=True)
class ThreadResult:
    """The result of one thread's step in a batch: its outcome, or the error that failed its records."""

    thread_id: str
    outcome: StepOutcome | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def group_by_thread(batch: Sequence[StepInput]) -> dict[str, list[StepInput]]:
    """The batch's inputs per thread (``group_id``), each thread's in arrival order."""
    groups: dict[str, list[StepInput]] = {}
    for item in batch:
        groups.setdefault(item.message.group_id, []).append(item)
    return groups


def trace_of(thread_id: str, inputs: Sequence[StepInput]) -> tuple[str | None, str | None]:
    """The trace a step joins: ``(parent traceparent, seed)``. The parent is the context its user text
    arrived with, else that of its first input that has one (a tool result, a child's report, a wake-up:
    each carries the context of the step that caused it). With none, the seed — the thread and the first
    input's logical id — makes a new trace whose id a redelivery reproduces."""
    users = [
        i
        for i in inputs
        if i.traceparent and isinstance(i.message.content, TextContent) and i.message.synthetic is None
    ]
    carried = users or [i for i in inputs if i.traceparent]
    if carried:
        return carried[0].traceparent, None
    return None, f"{thread_id}\x1f{inputs[0].message_id}" if inputs else thread_id


def starts_turn(inputs: Sequence[StepInput]) -> bool:
    """Whether a step of ``inputs`` begins a turn: one of them is a person's text."""
    return any(isinstance(i.message.content, TextContent) and i.message.synthetic is None for i in inputs)


def turn_trace_key(thread_id: str) -> str:
    """The state cache key of the trace context of ``thread_id``'s turn while it waits for a decision."""
    return f"trace-turn#{thread_id}"


class AgentSystem:
    """Runs steps against a pair of stores with one configuration."""

    def __init__(self, conversation: ConversationStore, state: StateStore, config: StepConfig) -> None:
        self.conversation = conversation
        self.state = state
        self.config = config

    async def step_thread(
        self,
        thread_id: str,
        inputs: Sequence[StepInput],
        observer: Observer,
        *,
        cancel: asyncio.Event | None = None,
        on_start: Callable[[ThreadStep], None] | None = None,
    ) -> StepOutcome:
        """One step of one thread. ``cancel`` stops its completion early (local mode's interruption);
        ``on_start`` sees the step before it runs (local mode reads its in-flight turn for replays)."""
        step = ThreadStep(self.conversation, self.state, self.config, observer, thread_id, cancel=cancel)
        if on_start is not None:
            on_start(step)
        tracer = self.config.tracer
        if tracer is None:
            return await step.run(inputs)
        parent, seed = trace_of(thread_id, inputs)
        first = starts_turn(inputs)
        if parent is None and not first:
            parent = await self._paused_turn(thread_id)  # a decision resumes the turn that waited for it
        with continuing(parent):
            async with traced(tracer, "invoke_agent", step_attributes(thread_id), seed=seed) as span:
                anchor = span.traceparent if first or parent is None else parent
                with carrying_turn(anchor):
                    try:
                        return await step.run(inputs)
                    finally:
                        await self._traced_end(step, span, anchor)

    async def _paused_turn(self, thread_id: str) -> str | None:
        try:
            return await self.state.cache_get(turn_trace_key(thread_id))
        except Exception as error:  # tracing never fails a step: the step starts a trace of its own
            log.warning("could not read the trace of the turn %s paused: %s", thread_id, error)
            return None

    async def _traced_end(self, step: ThreadStep, span: Span, anchor: str | None) -> None:
        """Annotate the step's span; remember the turn's context if the thread now waits for a decision."""
        history = step.history
        if history is None:
            return
        span.set_attributes(
            {
                "gen_ai.conversation.id": history.root_thread_id,
                "gen_ai.agent.name": profile_name(history.metadata) or "stepagent",
            }
        )
        if anchor is None or history.waiting_for_approval() is None:
            return
        try:
            await self.state.cache_put(turn_trace_key(step.thread_id), anchor, time.time() + TURN_TRACE_TTL_S)
        except Exception as error:  # the decision's step then starts a trace of its own
            log.warning("could not remember the trace of %s's turn: %s", step.thread_id, error)

    async def step(
        self, batch: Sequence[StepInput | tuple[InputMessage, str]], observer: Observer | None = None
    ) -> list[ThreadResult]:
        """Run one step per thread in ``batch``; return one result per thread, in first-appearance order."""
        observer = observer if observer is not None else EventCollector()
        inputs = [item if isinstance(item, StepInput) else StepInput(*item) for item in batch]
        groups = group_by_thread(inputs)

        async def run(thread_id: str, items: list[StepInput]) -> ThreadResult:
            try:
                return ThreadResult(thread_id, await self.step_thread(thread_id, items, observer))
            except Exception as error:  # reported per thread; the caller fails only this thread's records
                return ThreadResult(thread_id, error=error)

        return list(await asyncio.gather(*(run(t, items) for t, items in groups.items())))
