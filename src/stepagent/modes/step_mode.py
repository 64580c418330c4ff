"""Step mode: ``AgentSystem.step(batch)`` — one batch of input messages, stepped in process (the testing
harness and embedders use it; the queue worker, :mod:`stepagent.aws.worker`, runs the same
:class:`~stepagent.core.step.ThreadStep` per thread itself).

A batch is grouped by thread (first-appearance order of threads, arrival order within a thread); the
threads run concurrently, each as one :class:`~stepagent.core.step.ThreadStep`. A thread's failure is
reported for that thread only: the other threads' steps run to completion (each commit is atomic, so
nothing is ever left half-written), and the caller decides per thread what to retry.

Each thread's step is one ``invoke_agent`` span (with a tracer configured): the child of the trace context
its inputs arrived with (:func:`trace_of`), annotated with the conversation (root thread) and the agent
(the profile, else ``stepagent``) once the step has loaded the thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stepagent.agent_config import profile_name
from stepagent.core.step import StepConfig, StepInput, StepOutcome, ThreadStep
from stepagent.events import EventCollector, Observer
from stepagent.messages import InputMessage, TextContent
from stepagent.stores.base import ConversationStore, StateStore
from stepagent.tracing import continuing, step_attributes, traced


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
        with continuing(parent):
            async with traced(tracer, "invoke_agent", step_attributes(thread_id), seed=seed) as span:
                try:
                    return await step.run(inputs)
                finally:
                    history = step.history
                    if history is not None:
                        span.set_attributes(
                            {
                                "gen_ai.conversation.id": history.root_thread_id,
                                "gen_ai.agent.name": profile_name(history.metadata) or "stepagent",
                            }
                        )

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
