"""Live progress for clients: the partial text of a running completion and the notices of a thread, written
to the thread's ``LIVE`` item (:mod:`stepagent.stores.dynamodb.live`) by the worker.

Guarantees:

- **At the model's pace, at most one write per interval.** While a step streams text, :class:`StepLive`
  writes the partial turn (text so far, what the model is doing, the tool being called) at once when the
  first text arrives, then at most once per ``interval`` (0.2 s, counted from the start of the previous
  write): a reader polling the item at least that often sees the text within about one interval of the
  model writing it, in several updates a second. A completion that is thinking or calling a tool is
  written only ``first_delay`` (0.25 s) after it began to stream, and one silent for
  :data:`LIVE_SLOW_START_S` shows ``thinking``: a quick tool call costs no write. A step that wrote clears
  the partial turn when it ends (committed, failed or not).
- **Never reported as committed.** The partial turn names the head version it follows; the step's commit
  moves the head past it, so the committed rows take over in the same read that would have shown it.
  Text streamed before a retried attempt or before a tool call is dropped from the partial turn as the
  step drops it from its turn buffer.
- **Never in the way.** A failed live write is logged and ends live writes for that step; the step itself
  never fails because of it. ``STEPAGENT_LIVE_TEXT=off`` turns partial text off (:meth:`LiveText.disabled`).
- **Notices.** :class:`NoticingPublisher` publishes output events as before and also records ``error``,
  ``oauth_required`` and ``limit_reached`` events in the thread's ``LIVE`` item (best effort), so a client that does not
  read the shared output queue still sees them.

Cost per step (counted in :attr:`LiveText.metrics`; ``make bench`` measures it): with partial text on,
one ``UpdateItem`` when text starts (or :data:`LIVE_SLOW_START_S` into a completion still silent), one per
further interval of streaming (five a second), one to clear; nothing for a step without a completion, or
whose completion only called a tool within ``first_delay``. Each write carries the whole partial turn, so it
is billed by its size: one write unit per started kilobyte of text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stepagent.aws.outputs import OutputPublisher
from stepagent.core.step import ThreadStep
from stepagent.events import (
    AgentEvent,
    CompletionFinished,
    CompletionStarted,
    Info,
    Observer,
    StepFailed,
    TextChunk,
    ThinkingChunk,
    ThinkingStarted,
    ToolCallStarted,
    TurnCommitted,
)
from stepagent.notices import Notice
from stepagent.outputs.events import OutputEvent
from stepagent.senders.sqs import SqsQueues
from stepagent.stores.base import ConversationStore, StateStore
from stepagent.stores.dynamodb.io import DynamoIo
from stepagent.stores.dynamodb.live import LiveStore
from stepagent.stores.metrics import StoreMetrics

if TYPE_CHECKING:  # the types-aiobotocore stubs: development only
    from types_aiobotocore_dynamodb import DynamoDBClient

log = logging.getLogger(__name__)

#: Seconds between the starts of two writes of one step's partial turn (with the API stream's busy poll,
#: how many updates a second a reader sees).
LIVE_INTERVAL_S = 0.2
#: Seconds from a step's first streamed event to its first write unless that event is text (a quick tool
#: call, over by then, writes nothing); text is written at once.
LIVE_FIRST_DELAY_S = 0.25
#: Seconds a completion may stay silent before the item says it is ``thinking``.
LIVE_SLOW_START_S = 0.5


class _Both:
    """An observer that hands every event to two others."""

    def __init__(self, first: Observer, second: Observer) -> None:
        self.first, self.second = first, second

    def on_event(self, thread_id: str, event: AgentEvent) -> None:
        self.first.on_event(thread_id, event)
        self.second.on_event(thread_id, event)


class StepLive:
    """The live writer of one step of one thread: an observer plus the step hook (``attach``)."""

    def __init__(
        self, store: LiveStore | None, thread_id: str, interval: float, first_delay: float = 0.0
    ) -> None:
        self.store = store
        self.thread_id = thread_id
        self.interval = interval
        self.first_delay = first_delay
        self.slow_start = max(LIVE_SLOW_START_S, interval / 2)
        self.writes = 0
        self._step: ThreadStep | None = None
        self._text = ""
        self._phase: str | None = None
        self._tool: str | None = None
        self._dirty = False
        self._written = False  # the item holds a partial turn of this step that close() must clear
        self._wake = asyncio.Event()
        self._text_seen = asyncio.Event()  # ends the first delay: text is shown at once
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._slow_start: asyncio.TimerHandle | None = None

    # ---- wiring ---------------------------------------------------------------------------------------

    def attach(self, step: ThreadStep) -> None:
        self._step = step

    def observing(self, observer: Observer) -> Observer:
        """``observer`` plus this writer (just ``observer`` when live text is off)."""
        return observer if self.store is None else _Both(observer, self)

    # ---- events ---------------------------------------------------------------------------------------

    def on_event(self, thread_id: str, event: AgentEvent) -> None:
        if self.store is None or self._closing.is_set():
            return
        match event:
            case CompletionStarted():
                # Written with the first chunk, or after a while if the model is slow to start.
                self._set("", "thinking", None, write=False)
                self._slow_start = asyncio.get_running_loop().call_later(self.slow_start, self._slow)
            case TextChunk(text=text):
                self._text_seen.set()
                self._set(self._text + text, "writing", None)
            case ThinkingStarted() | ThinkingChunk():
                if self._phase != "thinking" or self._text:
                    self._set(self._text, "thinking", None)
            case ToolCallStarted(name=name):
                # Text before a call is committed with it: the partial turn starts again after it.
                self._set("", "calling", name)
            case Info(text=text):
                # A retried stream: the step discarded what it had streamed.
                if self._phase is not None and "retrying" in text:
                    self._set("", "retrying", None)
            case TurnCommitted() | CompletionFinished() | StepFailed():
                self._phase, self._text, self._tool, self._dirty = None, "", None, False

    def _slow(self) -> None:
        if not self._closing.is_set() and self._phase == "thinking" and self._task is None:
            self._set(self._text, "thinking", None)

    def _set(self, text: str, phase: str, tool: str | None, *, write: bool = True) -> None:
        self._text, self._phase, self._tool = text, phase, tool
        if not write:
            return
        self._dirty = True
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    # ---- writing --------------------------------------------------------------------------------------

    async def _run(self) -> None:
        store = self.store
        assert store is not None
        if self.first_delay > 0 and not self._text_seen.is_set():
            # A completion that is over this soon (a quick tool call) costs no write; text ends the wait.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_either(self._closing, self._text_seen), self.first_delay)
        loop = asyncio.get_running_loop()
        while not self._closing.is_set():
            await self._wake.wait()
            self._wake.clear()
            if self._closing.is_set():
                return
            if not self._dirty or self._phase is None:
                continue
            self._dirty = False
            # The head version this partial turn follows is the one the step has committed so far: text
            # is reset at every commit boundary, so it is never written with a version it is part of.
            history = self._step.history if self._step is not None else None
            version = history.version if history is not None else 0
            started = loop.time()
            try:
                await store.show(self.thread_id, version, self._text, self._phase, self._tool)
            except Exception as error:  # live text is a courtesy: never let it fail the step
                log.warning("live text for thread %s is off for this step: %s", self.thread_id, error)
                self.store = None
                return
            self.writes += 1
            self._written = True
            # The throttle, from the start of this write: the pace does not slow with the store's latency.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), max(0.0, started + self.interval - loop.time()))
            if self._dirty:
                self._wake.set()

    async def close(self) -> None:
        """Stop writing; clear the partial turn if this step wrote one."""
        self._closing.set()
        self._wake.set()
        if self._slow_start is not None:
            self._slow_start.cancel()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self._written and self.store is not None:
            try:
                await self.store.clear(self.thread_id)
            except Exception as error:  # the version check hides it anyway; the TTL reclaims it
                log.warning("could not clear the live text of thread %s: %s", self.thread_id, error)


async def _either(first: asyncio.Event, second: asyncio.Event) -> None:
    """Returns when either event is set."""
    waits = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


class LiveText:
    """Live writers for the worker's steps, sharing one client and one set of counters."""

    def __init__(
        self,
        client: DynamoDBClient | None,
        state_table: str | None,
        *,
        enabled: bool,
        interval: float = LIVE_INTERVAL_S,
        first_delay: float = LIVE_FIRST_DELAY_S,
    ) -> None:
        self.metrics = StoreMetrics()
        self.interval = interval
        self.first_delay = first_delay
        self.store = (
            LiveStore(DynamoIo(client, None, None, self.metrics), state_table)
            if client is not None and state_table is not None
            else None
        )
        self.enabled = enabled and self.store is not None

    @classmethod
    def disabled(cls) -> LiveText:
        return cls(None, None, enabled=False)

    def step(self, thread_id: str) -> StepLive:
        return StepLive(self.store if self.enabled else None, thread_id, self.interval, self.first_delay)


class NoticingPublisher(OutputPublisher):
    """An :class:`~stepagent.aws.outputs.OutputPublisher` that also keeps a thread's ``error``,
    ``oauth_required`` and ``limit_reached`` events in its ``LIVE`` item."""

    def __init__(
        self,
        queues: SqsQueues,
        output_queue_url: str,
        conversation: ConversationStore,
        state: StateStore,
        live: LiveText,
    ) -> None:
        super().__init__(queues, output_queue_url, conversation, state)
        self.live = live

    async def publish(
        self,
        thread_id: str,
        events: Sequence[OutputEvent],
        *,
        context: tuple[str, Any] | None = None,
    ) -> None:
        # Notices first: a client that sees the step's commit should find them as soon as possible.
        await self._notice(thread_id, events)
        await super().publish(thread_id, events, context=context)

    async def _notice(self, thread_id: str, events: Sequence[OutputEvent]) -> None:
        store = self.live.store
        if store is None:
            return
        for event in events:
            notice = _notice_of(event)
            if notice is not None:
                try:
                    await store.notice(thread_id, notice)
                except Exception as error:  # the output queue has it; this copy is for polling clients
                    log.warning("could not record a %s notice for %s: %s", event["type"], thread_id, error)


def _notice_of(event: OutputEvent) -> Notice | None:
    """``event`` if it is of a kind the ``LIVE`` item keeps as a notice."""
    if event["type"] == "error" or event["type"] == "oauth_required" or event["type"] == "limit_reached":
        return event
    if event["type"] == "input_required":
        return event
    return None
