"""Local mode: long-lived agents in one process, on the same step engine as the Lambda worker.

``LocalAgentSystem`` is an in-process queue, a router and one :class:`~stepagent.modes.local_driver.ThreadDriver`
per active thread. Every batch runs as one :class:`~stepagent.core.step.ThreadStep`, so local mode keeps
every step-mode guarantee (reload from the stores each step, atomic commit, dispatch outbox, durable
deferral) and adds what only a resident process can do: interrupting a running completion, replaying a
thread to a client that starts watching it mid-stream, and lifecycle events.

Guarantees:

- **Routing.** An input for a thread with a live driver goes to that driver; otherwise a driver is spawned
  — except that an input which is not plain user text, for a thread that does not exist or is closed, is
  dropped (no driver, no record, no lifecycle event). User text always creates or wakes its thread. The
  router handles one input at a time, so a thread never gets two drivers. If the store cannot answer the
  admission question, the input is admitted (the step decides).
- **Dedup.** Like an SQS FIFO queue, a second send of the same ``(thread, dedup id)`` within the last
  ``DEDUP_WINDOW`` sends is dropped; the dedup id becomes the message's logical id (unless the message
  carries its own ``id``), so the thread's own dedup covers anything older.
- **Lifecycle.** Each driver emits :class:`Live` when it starts and exactly one :class:`Idle` when it
  exits, Live first. Threads are independent: a child may stay live after its root went idle.
- **Replay ordering.** A subscriber's first item is a :class:`ReplaySnapshot`; every event of the thread
  is then either reflected in that snapshot or delivered after it, exactly once. (Events are delivered
  synchronously from inside the step, and a snapshot that needed a store read is retaken if an event
  slipped in meanwhile.)
- **Shutdown** stops accepting input, cancels in-flight completions (their visible partial turn and the
  inputs they prepared are committed), waits for every driver, then cancels background tool calls and
  timers. Inputs that had not started a step are not lost silently: they are kept in :attr:`dead_letters`.
  Sends made while shutting down raise :class:`LocalSystemClosed`, a transient error, so a step that was
  dispatching leaves its outbox intent open for the next run instead of marking a lost send as done.

Automatic compaction is the step's own rule (``core/step.py``, shared with step mode): the request travels
through this queue like any input, and a durable claim keeps one compaction per thread at a time.

Everything lives in memory unless the system is given durable stores; timers and background tool calls
never survive the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Self

from stepagent.agent_config import AgentConfig
from stepagent.backoff import Backoff
from stepagent.core.completion import RetryPolicy
from stepagent.core.history import HistoryManager
from stepagent.core.step import StepConfig, StepInput
from stepagent.errors import ConfigurationError, QueueError
from stepagent.events import AgentEvent, Observer
from stepagent.history_items import HistoryItem
from stepagent.messages import InputMessage
from stepagent.modes.local_driver import (
    Idle,
    LifecycleEvent,
    Live,
    LocalDeadLetter,
    LocalObserver,
    ReplaySnapshot,
    ThreadDriver,
)
from stepagent.modes.step_mode import AgentSystem
from stepagent.providers.base import ModelProvider
from stepagent.providers.factory import make_provider
from stepagent.providers.prices import CATALOG_PRICES, PriceTable
from stepagent.stores.base import ConversationStore, StateStore
from stepagent.stores.memory import memory_stores
from stepagent.tools.base import LifecycleNotifier, Tool, Toolset
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.functions import InProcessFunctionRunner
from stepagent.tools.sleep import InProcessTimers, Sleep, SleepUntil
from stepagent.tracing import Tracer, current_traceparent

__all__ = [
    "Idle",
    "LifecycleEvent",
    "Live",
    "LocalAgentSystem",
    "LocalDeadLetter",
    "LocalSender",
    "LocalSystemClosed",
    "ReplaySnapshot",
    "ThreadHandle",
    "ThreadSubscription",
]

log = logging.getLogger(__name__)

DEDUP_WINDOW = 10_000
#: A failed step is run again after ~0.05 s, ~0.25 s and ~1 s (jittered), then dead-lettered: the worker's
#: redelivery, compressed to what an interactive process can wait.
STEP_BACKOFF = Backoff(attempts=4, base=0.05, factor=5.0, cap=1.0)
_SNAPSHOT_ATTEMPTS = 20
_IDLE_POLL = 0.005  # background tool tasks and timers do not announce themselves; poll them this often


class LocalSystemClosed(QueueError):
    """The local system is shutting down (or was shut down) and accepts no more input."""


class LocalSender:
    """The ``InputSender`` of a local system: every message the runtime sends (tool results, reports, seeds,
    wake-ups, compaction requests) goes through the system's router, like user input."""

    def __init__(self) -> None:
        self._system: LocalAgentSystem | None = None

    def bind(self, system: LocalAgentSystem) -> None:
        if self._system is not None and self._system is not system:
            raise ConfigurationError("this LocalSender already feeds another LocalAgentSystem")
        self._system = system

    async def send(self, message: InputMessage, dedup_id: str) -> None:
        if self._system is None:
            raise ConfigurationError("this LocalSender is not bound to a LocalAgentSystem")
        self._system.enqueue(message, dedup_id)


class ThreadSubscription:
    """An async iterator over one thread: a :class:`ReplaySnapshot` first (taken when iteration starts),
    then every observer event of the thread. Ends when the system shuts down or on :meth:`aclose`."""

    def __init__(self, system: LocalAgentSystem, thread_id: str) -> None:
        self.thread_id = thread_id
        self._system = system
        self._queue: asyncio.Queue[AgentEvent | None] = asyncio.Queue()
        self._started = False
        self._done = False

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ReplaySnapshot | AgentEvent:
        if self._done:
            raise StopAsyncIteration
        if not self._started:
            self._started = True
            return await self._system._open_subscription(self.thread_id, self._queue)
        item = await self._queue.get()
        if item is None:
            self._done = True
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        self._done = True
        self._system._close_subscription(self.thread_id, self._queue)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()


class ThreadHandle:
    """One thread of a local system."""

    def __init__(self, system: LocalAgentSystem, thread_id: str) -> None:
        self.system = system
        self.thread_id = thread_id

    def subscribe(self) -> ThreadSubscription:
        return ThreadSubscription(self.system, self.thread_id)

    async def replay(self) -> ReplaySnapshot:
        return await self.system._snapshot(self.thread_id)

    async def history(self) -> list[HistoryItem]:
        """The committed history, as the next step would load it."""
        return (
            await HistoryManager.load(self.system.conversation, self.system.state, self.thread_id)
        ).history


class LocalAgentSystem:
    """Local mode. Build with :meth:`create` (or from stores and a :class:`StepConfig` whose sender is a
    :class:`LocalSender`), then ``async with system:`` or :meth:`start` / :meth:`shutdown`."""

    def __init__(
        self,
        conversation: ConversationStore,
        state: StateStore,
        config: StepConfig,
        *,
        observer: Observer | None = None,
        step_retry: Backoff = STEP_BACKOFF,
        lifecycle_buffer: int = 10_000,
    ) -> None:
        if not isinstance(config.sender, LocalSender):
            raise ConfigurationError("a LocalAgentSystem needs a LocalSender as its config's sender")
        config.sender.bind(self)
        self.conversation = conversation
        self.state = state
        self.config = config
        self.agent = AgentSystem(conversation, state, config)
        #: Batches that could not be processed (steps that kept failing, inputs left at shutdown).
        self.dead_letters: list[LocalDeadLetter] = []
        self._observer = LocalObserver(observer)
        self._step_retry = step_retry
        self._drivers: dict[str, ThreadDriver] = {}
        self._inbox: deque[StepInput] = deque()
        self._inbox_ready = asyncio.Event()
        self._routing = False
        self._router: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False
        self._recent: OrderedDict[tuple[str, str], None] = OrderedDict()
        # Bounded so an application that never reads lifecycle events does not grow without limit.
        self._lifecycle: deque[LifecycleEvent] = deque(maxlen=lifecycle_buffer)
        self._lifecycle_ready = asyncio.Event()
        self._changed = asyncio.Event()

    @classmethod
    def create(
        cls,
        provider: ModelProvider,
        *,
        tools: Iterable[Tool] = (),
        agent: AgentConfig | None = None,
        providers: Mapping[str, ModelProvider] | None = None,
        stores: tuple[ConversationStore, StateStore] | None = None,
        observer: Observer | None = None,
        retry: RetryPolicy | None = None,
        notifier: LifecycleNotifier | None = None,
        tracer: Tracer | None = None,
        step_retry: Backoff = STEP_BACKOFF,
        prices: PriceTable = CATALOG_PRICES,
    ) -> LocalAgentSystem:
        """A system with in-memory stores (unless ``stores`` is given), ``tools`` followed by every built-in
        tool (``agent.builtin_tools`` chooses which the model is offered; a tool in ``tools`` with a
        built-in's name replaces that built-in), function tools run in background
        tasks and real asyncio timers. ``agent`` is the agent's configuration (the same object the worker
        builds from ``STEPAGENT_*`` settings); a profile's ``<provider>:<model id>`` is built with
        :func:`~stepagent.providers.factory.make_provider` unless ``providers`` has it."""
        user_tools = list(tools)
        agent = agent if agent is not None else AgentConfig()
        # A tool of yours named like a built-in replaces that built-in (it is then one of your tools).
        taken = {tool.name for tool in user_tools}
        builtins = [t for t in [*builtin_tools(), Sleep(), SleepUntil()] if t.name not in taken]
        toolset = Toolset.of([*user_tools, *builtins])
        models = dict(providers or {})
        for profile in agent.profiles.values():
            if isinstance(profile.model, str) and profile.model not in models:
                models[profile.model] = make_provider(profile.model, context_window=profile.context_window)
        sender = LocalSender()
        config = StepConfig(
            provider=provider,
            toolset=toolset,
            sender=sender,
            agent=agent,
            providers=models,
            tracer=tracer,
            timers=InProcessTimers(sender),
            runner=InProcessFunctionRunner(user_tools, background=True),
            notifier=notifier,
            retry=retry if retry is not None else RetryPolicy(),
            prices=prices,
        )
        conversation, state = stores if stores is not None else memory_stores()
        return cls(conversation, state, config, observer=observer, step_retry=step_retry)

    # ---- running ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._closing:
            raise LocalSystemClosed("a local system cannot be restarted after shutdown")
        if self._router is None:
            self._router = asyncio.create_task(self._route_loop(), name="stepagent router")

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.shutdown()

    # ---- input ------------------------------------------------------------------------------------------

    async def send(self, message: InputMessage, dedup_id: str) -> None:
        """Put ``message`` on the queue (its logical id = ``message.id``, else ``dedup_id``)."""
        self.enqueue(message, dedup_id)

    async def send_user_text(self, thread_id: str, text: str) -> str:
        """Send user text to ``thread_id`` with a fresh id; returns the id."""
        message_id = str(uuid.uuid4())
        self.enqueue(InputMessage.user_text(thread_id, text, id=message_id), message_id)
        return message_id

    def thread(self, thread_id: str) -> ThreadHandle:
        return ThreadHandle(self, thread_id)

    def enqueue(self, message: InputMessage, dedup_id: str) -> None:
        """The queue's one entry point (synchronous: nothing can interleave with it)."""
        if self._closing:
            raise LocalSystemClosed("the local system is shut down and accepts no more input")
        key = (message.group_id, dedup_id)
        if key in self._recent:
            return
        self._recent[key] = None
        if len(self._recent) > DEDUP_WINDOW:
            self._recent.popitem(last=False)
        logical = message if message.id is not None else message.model_copy(update={"id": dedup_id})
        # The sender's trace context goes with the message, as the SQS sender's attribute does.
        self._inbox.append(StepInput(logical, logical.id or dedup_id, current_traceparent()))
        self._inbox_ready.set()
        self._changed.set()

    # ---- lifecycle and idleness --------------------------------------------------------------------------

    # A timeout parameter (ASYNC109) on purpose: tests and examples wait with one call.
    async def next_lifecycle_event(self, timeout: float | None = None) -> LifecycleEvent:  # noqa: ASYNC109
        """The next :class:`Live`/:class:`Idle` event, waiting up to ``timeout`` seconds (``TimeoutError``)."""
        async with asyncio.timeout(timeout):
            while not self._lifecycle:
                self._lifecycle_ready.clear()
                await self._lifecycle_ready.wait()
        return self._lifecycle.popleft()

    def try_next_lifecycle_event(self) -> LifecycleEvent | None:
        return self._lifecycle.popleft() if self._lifecycle else None

    @property
    def live_threads(self) -> list[str]:
        return list(self._drivers)

    def is_idle(self) -> bool:
        """No driver, nothing queued or being routed, no background tool call running and no in-process
        timer due. (A timer not yet due does not count: its thread wakes up later.)"""
        if self._drivers or self._inbox or self._routing:
            return False
        runner = self.config.runner
        if isinstance(runner, InProcessFunctionRunner) and runner.running:
            return False
        timers = self.config.timers
        if isinstance(timers, InProcessTimers) and not timers.manual:
            now = timers.clock()
            if any(timer.due <= now for timer in timers.scheduled):
                return False
        return True

    async def wait_idle(self, timeout: float | None = 30.0) -> None:  # noqa: ASYNC109
        """Wait until :meth:`is_idle` (``TimeoutError`` after ``timeout`` seconds)."""
        async with asyncio.timeout(timeout):
            while not self.is_idle():
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), _IDLE_POLL)

    # ---- shutdown -----------------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Stop accepting input, cancel in-flight completions (they commit what they streamed), wait for the
        drivers, then cancel background tool calls and timers. Idempotent."""
        if self._closed:
            return
        self._closing = True
        await self._stop_background()  # nothing they produce could be accepted now
        while self._drivers:
            drivers = list(self._drivers.values())
            for driver in drivers:
                driver.close()
            await asyncio.gather(*(d.task for d in drivers if d.task is not None))
        await self._stop_background()  # what the last steps dispatched
        if self._router is not None:
            self._router.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._router
        if self._inbox:
            self.dead_letters.append(
                LocalDeadLetter(list(self._inbox), "the system shut down before routing")
            )
            self._inbox.clear()
        self._closed = True
        for view in list(self._observer.views.values()):
            for queue in view.subscribers:
                queue.put_nowait(None)
            view.subscribers.clear()
        self._changed.set()

    async def _stop_background(self) -> None:
        if isinstance(self.config.runner, InProcessFunctionRunner):
            await self.config.runner.aclose()
        if isinstance(self.config.timers, InProcessTimers):
            await self.config.timers.aclose()

    # ---- the router ------------------------------------------------------------------------------------------

    async def _route_loop(self) -> None:
        while True:
            while self._inbox:
                item = self._inbox.popleft()
                self._routing = True
                try:
                    await self._route(item)
                except Exception:  # a bug; keep routing the other threads
                    log.exception("routing an input for thread %s failed", item.message.group_id)
                    self.dead_letters.append(LocalDeadLetter([item], "routing failed"))
                finally:
                    self._routing = False
                    self._changed.set()
            self._inbox_ready.clear()
            await self._inbox_ready.wait()

    async def _route(self, item: StepInput) -> None:
        thread_id = item.message.group_id
        driver = self._drivers.get(thread_id)
        if driver is not None:
            if not driver.deliver(item):
                self.dead_letters.append(
                    LocalDeadLetter([item], "the system shut down before this input ran")
                )
            return
        if not item.message.is_user_text and not await self._admit(thread_id):
            log.info("dropped an input for unknown or closed thread %s", thread_id)
            return
        if self._closing:
            self.dead_letters.append(LocalDeadLetter([item], "the system shut down before routing"))
            return
        driver = ThreadDriver(
            thread_id,
            agent=self.agent,
            observer=self._observer,
            on_exit=self._driver_exited,
            on_dead_letter=self.dead_letters.append,
            step_retry=self._step_retry,
        )
        self._drivers[thread_id] = driver
        self._emit_lifecycle(Live(thread_id))
        driver.deliver(item)
        driver.start()

    async def _admit(self, thread_id: str) -> bool:
        """Only existing, open threads are woken by non-user input (a stale result or event must not
        create a thread). A store error admits: the step itself will fail and retry, nothing is lost."""
        try:
            info = await self.conversation.get_thread(thread_id)
        except Exception:
            log.warning("admission check for thread %s failed; admitting", thread_id, exc_info=True)
            return True
        return info is not None and not info.closed

    def _driver_exited(self, driver: ThreadDriver) -> None:
        thread_id = driver.thread_id
        if self._drivers.get(thread_id) is driver:
            del self._drivers[thread_id]
        leftovers = driver.take_leftovers()
        if leftovers:  # shutdown (or a driver bug) left inputs that never ran
            self.dead_letters.append(LocalDeadLetter(leftovers, "the driver exited before these inputs ran"))
        self._emit_lifecycle(Idle(thread_id))
        self._observer.release(thread_id)
        self._changed.set()

    def _emit_lifecycle(self, event: LifecycleEvent) -> None:
        self._lifecycle.append(event)
        self._lifecycle_ready.set()

    # ---- replay and subscriptions -------------------------------------------------------------------------

    async def _snapshot(
        self, thread_id: str, subscriber: asyncio.Queue[AgentEvent | None] | None = None
    ) -> ReplaySnapshot:
        """Take a snapshot and (atomically with it) register ``subscriber`` for the events after it.

        The in-flight step's history is read synchronously. The two store reads (pending choices, and the
        committed history when no step is loaded) are awaits: if an event that could change what they
        returned was emitted meanwhile, the snapshot is retaken."""
        view = self._observer.view(thread_id)
        view.pins += 1
        try:
            for attempt in range(_SNAPSHOT_ATTEMPTS):
                version, choices_version = view.version, view.choices_version
                choices = await self.state.pending_choices(thread_id)
                live = view.live_history()
                if live is not None:
                    consistent = view.choices_version == choices_version
                    history = live.current_turn_view()
                else:
                    loaded = await HistoryManager.load(self.conversation, self.state, thread_id)
                    consistent = view.version == version
                    history = list(loaded.history)
                if consistent or attempt == _SNAPSHOT_ATTEMPTS - 1:
                    if subscriber is not None:
                        view.subscribers.append(subscriber)
                    return ReplaySnapshot(history, view.thinking, view.in_progress, list(choices))
            raise AssertionError("unreachable")
        finally:
            view.pins -= 1
            self._observer.release(thread_id)

    async def _open_subscription(
        self, thread_id: str, queue: asyncio.Queue[AgentEvent | None]
    ) -> ReplaySnapshot:
        if self._closed:
            queue.put_nowait(None)
            return await self._snapshot(thread_id)
        return await self._snapshot(thread_id, queue)

    def _close_subscription(self, thread_id: str, queue: asyncio.Queue[AgentEvent | None]) -> None:
        view = self._observer.views.get(thread_id)
        if view is not None and queue in view.subscribers:
            view.subscribers.remove(queue)
            self._observer.release(thread_id)
        queue.put_nowait(None)
