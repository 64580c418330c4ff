"""Driving step mode entirely in one process: an in-memory queue feeding ``AgentSystem.step`` until no
thread has work left. Used by tests, examples and anyone who wants step-mode semantics without AWS."""

from __future__ import annotations

from dataclasses import dataclass

from stepagent.core.step import StepInput
from stepagent.events import Observer
from stepagent.messages import InputMessage
from stepagent.modes.step_mode import AgentSystem, ThreadResult
from stepagent.senders.inprocess import InProcessSender


@dataclass(slots=True)
class InProcessQueueDriver:
    """Step mode over an in-memory queue: what ``sender`` collects is stepped by ``system``, batch by batch."""

    system: AgentSystem
    sender: InProcessSender

    async def send(self, message: InputMessage, dedup_id: str) -> None:
        await self.sender.send(message, dedup_id)

    async def run_until_idle(self, observer: Observer, *, max_batches: int = 1000) -> list[ThreadResult]:
        """Step batches (each = everything queued) until the queue is empty. Failed threads are reported;
        their inputs are not re-queued (tests re-deliver explicitly)."""
        results: list[ThreadResult] = []
        for _ in range(max_batches):
            queued = self.sender.drain()
            if not queued:
                return results
            batch = [StepInput(q.message, q.message_id, q.traceparent) for q in queued]
            results.extend(await self.system.step(batch, observer))
        raise RuntimeError(f"the queue did not drain within {max_batches} batches")
