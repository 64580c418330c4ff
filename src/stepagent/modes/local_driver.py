"""Local mode, per thread: the driver that runs a thread's steps, and the observer that keeps what a replay
needs. :mod:`stepagent.modes.local` builds the system (router, queue, lifecycle, shutdown) on top.

A driver never re-implements the step: each batch runs as one
:class:`~stepagent.core.step.ThreadStep` (through :meth:`AgentSystem.step_thread`), which reloads the thread
from the stores, commits atomically, keeps its dispatch outbox and defers events durably. What the driver
adds is scheduling. Guarantees:

- **One driver per thread**, and one step in flight per driver: a thread's steps never overlap.
- **Batching.** Everything queued for the thread when a step starts is that step's batch, in arrival order.
- **Interruption.** While a step runs, arriving user text cancels it (its completion stops at once, keeps
  the visible partial turn, commits, and still dispatches a tool call it already emitted); the next step
  gets everything that arrived meanwhile, in arrival order, the first user text prefixed ``<interrupt>``
  (same message id). So an interrupting text never overtakes an event that arrived before it, exactly as
  in step mode, where a thread's inputs keep their queue order. Non-user inputs never interrupt: they
  wait for the next step.
- **Residency.** After a step the driver stays only while the thread awaits a tool result (a trailing
  unanswered call other than ``close_thread`` — timed sleeps included, but not a call that is never
  answered, such as ``sleep_until_event_or_input``: the next event or input starts a fresh driver). Otherwise it exits, deciding
  synchronously (no await between the last queue check and leaving the registry), so an input either
  lands in this driver's queue or finds it gone and gets a new one.
- **No silent loss.** A step that raises is retried with the same batch when
  :func:`~stepagent.errors.classify` says ``retry``, as the worker decides (redelivery is harmless: message
  ids dedupe); after the last attempt the batch is reported (``StepFailed``, ``retrying=False``) and kept
  as a dead letter.
- **Compaction** needs nothing here: the step itself asks for it (``core/step.py``) through the sender, so
  the request queues behind the thread's other inputs, and its durable claim keeps it at most one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from stepagent.backoff import Backoff
from stepagent.core.history import HistoryManager
from stepagent.core.prepare import INTERRUPT_MARKER
from stepagent.core.step import StepInput, ThreadStep
from stepagent.errors import classify
from stepagent.events import (
    AgentEvent,
    CompletionFinished,
    CompletionStarted,
    Observer,
    StepFailed,
    TextChunk,
    ThinkingChunk,
    ThinkingEnded,
    ThinkingStarted,
    ToolCallStarted,
    ToolResultReceived,
    UserChoiceDismissed,
    UserChoiceRequiredEvent,
)
from stepagent.history_items import HistoryItem
from stepagent.messages import InputMessage, TextContent, UserChoiceRequired
from stepagent.modes.step_mode import AgentSystem
from stepagent.tools.base import Toolset

log = logging.getLogger(__name__)

#: A trailing call of this tool does not keep a driver resident: the thread closed itself.
CLOSE_TOOL = "close_thread"


# ----------------------------------------------------------------------------------------------------------
# Public value types


@dataclass(frozen=True, slots=True)
class Live:
    """A driver started for ``thread_id``. Always followed, later, by exactly one :class:`Idle`."""

    thread_id: str


@dataclass(frozen=True, slots=True)
class Idle:
    """The driver of ``thread_id`` exited."""

    thread_id: str


LifecycleEvent = Live | Idle


@dataclass(frozen=True, slots=True)
class ReplaySnapshot:
    """What a client needs to draw a thread it starts watching.

    ``history`` is the committed history plus the in-flight step's prepared inputs and partial turn;
    ``current_thinking`` the thinking text streamed since it was last cleared; ``in_progress`` whether a
    completion is running; ``pending_choices`` the thread's open user choices."""

    history: list[HistoryItem]
    current_thinking: str | None = None
    in_progress: bool = False
    pending_choices: list[UserChoiceRequired] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LocalDeadLetter:
    """A batch whose step kept failing (or could not run because the system shut down)."""

    inputs: list[StepInput]
    reason: str


# ----------------------------------------------------------------------------------------------------------
# Per-thread observation state


_CLEARS_THINKING = (
    TextChunk,
    ThinkingStarted,
    ThinkingEnded,
    ToolCallStarted,
    ToolResultReceived,
    CompletionFinished,
)


@dataclass(slots=True)
class ObservedThread:
    """What a replay of one thread needs, kept current by :class:`LocalObserver`.

    ``version`` moves on every event and step boundary and ``choices_version`` on every pending-choice
    change: a snapshot that had to await a store read is accepted only if they did not move meanwhile."""

    thread_id: str
    step: ThreadStep | None = None
    in_progress: bool = False
    thinking: str | None = None
    version: int = 0
    choices_version: int = 0
    subscribers: list[asyncio.Queue[AgentEvent | None]] = field(default_factory=list)
    pins: int = 0  # snapshots being taken; the view must outlive them

    def live_history(self) -> HistoryManager | None:
        """The in-flight step's history (``None`` between steps or before the step has loaded it)."""
        return self.step.history if self.step is not None else None

    @property
    def unused(self) -> bool:
        return self.step is None and not self.subscribers and self.pins == 0


class LocalObserver:
    """The observer every local step reports to: updates the thread's :class:`ObservedThread`, hands the event
    to the thread's subscribers, then to the user's observer. It runs synchronously inside the step (no
    await), so a snapshot taken between two awaits of a step is consistent with the events around it."""

    def __init__(self, forward: Observer | None = None) -> None:
        self.forward = forward
        self.views: dict[str, ObservedThread] = {}

    def view(self, thread_id: str) -> ObservedThread:
        view = self.views.get(thread_id)
        if view is None:
            view = self.views[thread_id] = ObservedThread(thread_id)
        return view

    def release(self, thread_id: str) -> None:
        """Forget a thread's view once nothing needs it (keeps memory bounded by active threads)."""
        view = self.views.get(thread_id)
        if view is not None and view.unused:
            del self.views[thread_id]

    def on_event(self, thread_id: str, event: AgentEvent) -> None:
        view = self.view(thread_id)
        if isinstance(event, ThinkingChunk):
            view.thinking = (view.thinking or "") + event.text
        elif isinstance(event, _CLEARS_THINKING):
            view.thinking = None
        if isinstance(event, CompletionStarted):
            view.in_progress = True
        elif isinstance(event, CompletionFinished):
            view.in_progress = False
        if isinstance(event, UserChoiceRequiredEvent | UserChoiceDismissed):
            view.choices_version += 1
        view.version += 1
        for queue in view.subscribers:
            queue.put_nowait(event)
        if self.forward is not None:
            try:
                self.forward.on_event(thread_id, event)
            except Exception:  # a display bug must not fail the step that reported the event
                log.exception("observer failed on %s for thread %s", type(event).__name__, thread_id)

    def step_started(self, step: ThreadStep) -> None:
        view = self.view(step.thread_id)
        view.step = step
        view.version += 1

    def step_ended(self, thread_id: str) -> None:
        view = self.view(thread_id)
        view.step = None
        view.in_progress = False
        view.thinking = None
        view.version += 1


# ----------------------------------------------------------------------------------------------------------
# The driver


def interrupting(message: InputMessage) -> InputMessage:
    """``message`` (user text) with its text prefixed ``<interrupt>``; same id, same everything else."""
    assert isinstance(message.content, TextContent)
    return message.model_copy(
        update={"content": TextContent(text=f"{INTERRUPT_MARKER} {message.content.text}")}
    )


def awaiting_tool_result(history: HistoryManager | None, toolset: Toolset | None = None) -> bool:
    """Whether the thread waits for a tool result: its history ends with an unanswered call that is not
    ``close_thread`` and whose tool answers at all (timed sleeps count: their wake-up is a result;
    ``sleep_until_event_or_input`` does not: only the next input ends it; nor does a call waiting for a
    person's decision)."""
    if history is None or (history.info is not None and history.info.closed):
        return False
    pending = history.pending_tool_call()
    if pending is None or pending.call.name == CLOSE_TOOL:
        return False
    if history.waiting_for_approval() is not None:
        return False  # nothing runs until a person decides: the decision starts a fresh driver
    tool = toolset.get(pending.call.name) if toolset is not None else None
    return tool is None or tool.answered


class ThreadDriver:
    """Runs one thread's steps until the thread has nothing to do."""

    def __init__(
        self,
        thread_id: str,
        *,
        agent: AgentSystem,
        observer: LocalObserver,
        on_exit: Callable[[ThreadDriver], None],
        on_dead_letter: Callable[[LocalDeadLetter], None],
        step_retry: Backoff,
    ) -> None:
        self.thread_id = thread_id
        self._agent = agent
        self._observer = observer
        self._on_exit = on_exit
        self._on_dead_letter = on_dead_letter
        self._step_retry = step_retry
        self._queue: deque[StepInput] = deque()  # arrived, not yet in a step
        self._interrupt: list[StepInput] = []  # what arrived up to an interruption: the very next step
        self._wakeup = asyncio.Event()
        self._closing = False
        self._cancel: asyncio.Event | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        # Drivers are never cancelled (shutdown uses close()), so _run always reaches its finally.
        self.task = asyncio.create_task(self._run(), name=f"stepagent driver {self.thread_id}")

    def deliver(self, item: StepInput) -> bool:
        """Queue an input for this thread; ``False`` if the driver is shutting down."""
        if self._closing:
            return False
        self._queue.append(item)
        self._wakeup.set()
        return True

    def close(self) -> None:
        """Shutdown: cancel the in-flight completion (it still commits) and exit after it."""
        self._closing = True
        if self._cancel is not None:
            self._cancel.set()
        self._wakeup.set()

    def take_leftovers(self) -> list[StepInput]:
        leftovers = [*self._interrupt, *self._queue]
        self._interrupt.clear()
        self._queue.clear()
        return leftovers

    # ---- the loop ---------------------------------------------------------------------------------------

    async def _run(self) -> None:
        awaiting = False
        try:
            while not self._closing:
                batch = self._take()
                if batch:
                    awaiting = await self._process(batch)
                elif awaiting:
                    await self._wakeup.wait()
                else:
                    return  # synchronous since _take(): nothing can have been queued in between
        except Exception:  # a driver bug; the step's own failures are handled in _step
            log.exception("the driver of thread %s failed", self.thread_id)
        finally:
            self._on_exit(self)

    def _take(self) -> list[StepInput]:
        if self._interrupt:
            batch, self._interrupt = self._interrupt, []
            return batch
        batch = list(self._queue)
        self._queue.clear()
        self._wakeup.clear()
        return batch

    async def _process(self, batch: list[StepInput]) -> bool:
        """Run one step for ``batch``, watching for interruptions. Returns whether the thread now awaits a
        tool result."""
        cancel = self._cancel = asyncio.Event()
        step = asyncio.create_task(self._step(batch, cancel), name=f"stepagent step {self.thread_id}")
        try:
            while not step.done():
                woken = asyncio.ensure_future(self._wakeup.wait())
                try:
                    await asyncio.wait({step, woken}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
                if step.done():
                    break
                self._wakeup.clear()
                if self._closing:
                    cancel.set()
                elif self._interrupt or any(item.message.is_user_text for item in self._queue):
                    self._split_interruption()
                    cancel.set()
        finally:
            self._cancel = None
        return step.result()

    def _split_interruption(self) -> None:
        """Move what arrived to the next step, in arrival order, the interruption's first user text marked
        ``<interrupt>``."""
        marked = any(item.message.is_user_text for item in self._interrupt)
        for item in self._queue:
            if item.message.is_user_text and not marked:
                item, marked = StepInput(interrupting(item.message), item.message_id, item.traceparent), True
            self._interrupt.append(item)
        self._queue.clear()

    async def _step(self, batch: list[StepInput], cancel: asyncio.Event) -> bool:
        """The step with retries. Never raises; returns whether the thread awaits a tool result."""
        attempt = 1
        started: list[ThreadStep] = []

        def on_start(step: ThreadStep) -> None:
            started[:] = [step]
            self._observer.step_started(step)

        while True:
            try:
                await self._agent.step_thread(
                    self.thread_id, batch, self._observer, cancel=cancel, on_start=on_start
                )
            except Exception as error:
                self._observer.step_ended(self.thread_id)
                delay = self._step_retry.delay(attempt)
                retry = (
                    self._step_retry.allows(attempt, delay)
                    and not self._closing
                    and classify(error) == "retry"
                )
                message = f"Step failed: {type(error).__name__}: {error}"
                log.warning("thread %s: %s (retrying: %s)", self.thread_id, message, retry)
                self._observer.on_event(self.thread_id, StepFailed(message=message, retrying=retry))
                if not retry:
                    self._on_dead_letter(LocalDeadLetter(list(batch), message))
                    return self._awaiting(started)
                # An interruption or shutdown cuts the wait short: the re-run then stops its completion
                # at once but still commits the batch.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(cancel.wait(), delay)
                attempt += 1
                continue
            self._observer.step_ended(self.thread_id)
            return self._awaiting(started)

    def _awaiting(self, started: list[ThreadStep]) -> bool:
        return awaiting_tool_result(started[0].history if started else None, self._agent.config.toolset)
