"""Crash injection at I/O boundaries, and a FIFO queue that redelivers what was not acknowledged.

``InjectedCrash`` derives from ``BaseException`` so that no ``except Exception`` in the runtime can
swallow it: it models the process dying (a Lambda timeout or OOM) between two I/O calls.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from stepagent.messages import CompactionComplete, InputMessage, ToolResult


class InjectedCrash(BaseException):
    pass


@dataclass
class FaultPlan:
    """Counts I/O calls across every wrapped object; raises ``InjectedCrash`` before call ``crash_at``."""

    crash_at: int | None = None
    calls: int = 0
    log: list[str] = field(default_factory=list)
    crashed: bool = False

    def tick(self, name: str) -> None:
        self.calls += 1
        self.log.append(name)
        if self.crash_at is not None and self.calls == self.crash_at and not self.crashed:
            self.crashed = True
            raise InjectedCrash(f"crash before I/O #{self.calls} ({name})")


class Faulty:
    """Wraps an object so each of its async methods (and async generators) counts as one I/O call."""

    def __init__(self, inner: Any, plan: FaultPlan, label: str) -> None:
        self._inner = inner
        self._plan = plan
        self._label = label
        # Since Python 3.12 ``isinstance`` against a runtime-checkable protocol (the stores'
        # ``SnapshotReader``) looks attributes up statically, so methods reached only through
        # ``__getattr__`` do not count: bind the inner object's public async methods on the instance, or the
        # code under test would take another path than it takes unwrapped.
        for name in dir(type(inner)):
            if not name.startswith("_"):
                attr = getattr(inner, name, None)
                if inspect.isasyncgenfunction(attr) or inspect.iscoroutinefunction(attr):
                    self.__dict__[name] = self.__getattr__(name)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if inspect.isasyncgenfunction(attr):
            return self._wrap_gen(attr, name)
        if inspect.iscoroutinefunction(attr):
            return self._wrap(attr, name)
        return attr

    def _wrap(self, method: Callable[..., Any], name: str) -> Callable[..., Any]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            self._plan.tick(f"{self._label}.{name}")
            return await method(*args, **kwargs)

        return call

    def _wrap_gen(
        self, method: Callable[..., AsyncIterator[Any]], name: str
    ) -> Callable[..., AsyncIterator[Any]]:
        async def gen(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            self._plan.tick(f"{self._label}.{name}")
            async for item in method(*args, **kwargs):
                yield item

        return gen


@dataclass
class Received:
    message: InputMessage
    message_id: str


@dataclass
class FifoQueue:
    """An SQS-FIFO-like queue: one message group in flight at a time, unacknowledged messages are
    delivered again, optional deduplication by (group, dedup id)."""

    dedupe: bool = True
    messages: list[Received] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)
    sends: list[tuple[str, str]] = field(default_factory=list)

    async def send(self, message: InputMessage, dedup_id: str) -> None:
        self.sends.append((message.group_id, dedup_id))
        key = (message.group_id, dedup_id)
        if self.dedupe and key in self.seen:
            return
        self.seen.add(key)
        logical = message if message.id is not None else message.model_copy(update={"id": dedup_id})
        self.messages.append(Received(logical, logical.id or dedup_id))

    def receive(self, limit: int = 10) -> list[Received]:
        """The oldest group's first ``limit`` messages (not removed until acknowledged)."""
        if not self.messages:
            return []
        group = self.messages[0].message.group_id
        return [m for m in self.messages if m.message.group_id == group][:limit]

    def ack(self, received: list[Received]) -> None:
        ids = {id(r) for r in received}
        self.messages = [m for m in self.messages if id(m) not in ids]


# ---- appended for the crash-injection matrix (tests/reliability/test_crash_matrix.py) ---------------------

#: Which simulated Lambda invocation the current task belongs to (tasks inherit it from the invocation that
#: created them, e.g. through ``asyncio.gather``).
INVOCATION: ContextVar[int] = ContextVar("stepagent_test_invocation", default=0)


@dataclass
class CrashPlan(FaultPlan):
    """A ``FaultPlan`` with several crash points and process-death semantics.

    A crash kills the whole invocation, not just the task that hit the crash point: concurrently running
    steps of the same invocation (``AgentSystem.step`` gathers one task per thread) raise
    ``InjectedCrash`` at their next I/O call, so a dead invocation never writes again — as when a Lambda
    sandbox is killed. Those "zombie" calls are not counted: they perform no I/O."""

    crash_points: frozenset[int] = frozenset()
    dead: set[int] = field(default_factory=set)
    crashes: int = 0

    def tick(self, name: str) -> None:
        invocation = INVOCATION.get()
        if invocation in self.dead:
            raise InjectedCrash(f"I/O ({name}) from invocation {invocation}, which already died")
        self.calls += 1
        self.log.append(name)
        if self.calls in self.crash_points:
            self.crashed = True
            self.crashes += 1
            self.dead.add(invocation)
            raise InjectedCrash(f"crash before I/O #{self.calls} ({name})")


async def in_invocation(number: int, work: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``work`` as simulated invocation ``number`` (in its own task, so the context var does not leak)."""

    async def run() -> Any:
        INVOCATION.set(number)
        return await work()

    return await asyncio.create_task(run())


class FaultyProvider:
    """Wraps a model provider: opening the stream is one I/O call, and so is every pull of the next event
    after the first (a crash *mid-stream*, between two chunks the step has already consumed)."""

    def __init__(self, inner: Any, plan: FaultPlan, label: str = "model") -> None:
        self.inner = inner
        self.plan = plan
        self.label = label

    @property
    def info(self) -> Any:
        return self.inner.info

    async def stream(self, request: Any) -> AsyncIterator[Any]:
        self.plan.tick(f"{self.label}.stream")
        async for event in self.inner.stream(request):
            yield event
            self.plan.tick(f"{self.label}.stream:next")


@dataclass
class MixedFifoQueue(FifoQueue):
    """A ``FifoQueue`` whose batches may span several message groups, as an SQS FIFO batch does: the first
    ``limit`` messages in queue order (a prefix, so each group's messages stay in order and a group is
    never delivered past one of its own undelivered messages). Records every body sent per
    ``(group, dedup id)`` so a test can require deterministic dedup ids (same id, same body)."""

    bodies: dict[tuple[str, str], str] = field(default_factory=dict)
    conflicting_bodies: list[tuple[str, str]] = field(default_factory=list)
    sent: SendLog = field(default_factory=lambda: SendLog())

    async def send(self, message: InputMessage, dedup_id: str) -> None:
        key = (message.group_id, dedup_id)
        body = message.model_dump_json()
        if self.bodies.setdefault(key, body) != body:
            self.conflicting_bodies.append(key)
        self.sent.record(message, dedup_id)
        await super().send(message, dedup_id)

    def receive_any(self, limit: int = 10) -> list[Received]:
        return list(self.messages[:limit])


@dataclass
class SendLog:
    """What was sent to the threads, for two invariant checks:

    - ``rekeyed_bodies``: a tool result (or report, or event) sent again with the same content under
      another dedup id — a dedup id that is not derived from what it identifies (a random one), which
      only the thread's own dedup would then absorb;
    - ``delivered``: every logical id sent to each thread, which must all end up recorded as processed
      (folded in, or absorbed as a duplicate or a late answer to an answered call)."""

    ids_by_body: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    delivered: dict[str, set[str]] = field(default_factory=dict)

    def record(self, message: InputMessage, dedup_id: str) -> None:
        self.delivered.setdefault(message.group_id, set()).add(message.id or dedup_id)
        # Compaction requests and completions legitimately repeat one body for distinct compactions.
        if isinstance(message.content, ToolResult) and not isinstance(message.synthetic, CompactionComplete):
            body = message.model_copy(update={"id": None}).model_dump_json()
            self.ids_by_body.setdefault((message.group_id, body), set()).add(dedup_id)

    @property
    def rekeyed_bodies(self) -> list[str]:
        return sorted(
            f"{group}: one body under dedup ids {sorted(ids)}"
            for (group, _), ids in self.ids_by_body.items()
            if len(ids) > 1
        )
