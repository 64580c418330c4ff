"""The console's view of the dead-letter queues, on :mod:`stepagent.aws.dlq` (what ``stepagent dlq`` uses).

One lock serialises every DLQ operation of the process: listing receives the messages for a moment (then
makes them visible again), so a redrive running at the same time would not see them. The per-thread counts
behind the *failed* status are cached for :data:`COUNT_TTL` seconds, and dropped after a redrive.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import TYPE_CHECKING

from stepagent.aws import dlq
from stepagent.aws.dlq import DeadLetter
from stepagent.aws.settings import Settings
from stepagent.errors import ConfigurationError

if TYPE_CHECKING:  # the types-aiobotocore stubs: a development dependency, never imported at run time
    from types_aiobotocore_sqs import SQSClient

COUNT_TTL = 5.0


class DeadLetters:
    """The input and tool DLQs of one deployment (whichever of the two the settings name)."""

    def __init__(self, sqs: SQSClient, settings: Settings) -> None:
        self.sqs = sqs
        self.sources = {
            name: url
            for name, url in (("input", settings.input_queue_url), ("tool", settings.tool_queue_url))
            if url
        }
        self._dlq_urls: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self._counts: tuple[float, dict[str, int]] | None = None
        self.problem: str | None = None  # why the DLQs cannot be read (shown on the page), if so

    async def _urls(self) -> dict[str, str]:
        for name, source in self.sources.items():
            if name not in self._dlq_urls:
                try:
                    self._dlq_urls[name] = await dlq.dead_letter_queue(self.sqs, source)
                except ConfigurationError as error:
                    self.problem = str(error)
        return self._dlq_urls

    async def letters(self, limit: int = 100) -> list[DeadLetter]:
        """Every dead-lettered message (up to ``limit`` per DLQ), left in its DLQ."""
        async with self._lock:
            found: list[DeadLetter] = []
            for name, url in (await self._urls()).items():
                found.extend(await dlq.list_dead_letters(self.sqs, url, name, limit))
            self._counts = (time.monotonic(), dict(Counter(f.thread_id for f in found if f.thread_id)))
            return found

    async def counts(self) -> dict[str, int]:
        """Per thread, how many of its messages are dead-lettered (cached for :data:`COUNT_TTL` s)."""
        cached = self._counts
        if cached is not None and time.monotonic() - cached[0] < COUNT_TTL:
            return cached[1]
        await self.letters()
        assert self._counts is not None
        return self._counts[1]

    async def redrive(self, message_ids: list[str] | None = None) -> list[DeadLetter]:
        """Send the named messages (every message when ``None``) back to their source queues."""
        async with self._lock:
            moved: list[DeadLetter] = []
            left: set[str] = set(message_ids or ())
            for name, url in (await self._urls()).items():
                if message_ids is None:
                    moved.extend(await dlq.redrive(self.sqs, url, self.sources[name], name))
                    continue
                present = {f.message_id for f in await dlq.list_dead_letters(self.sqs, url, name, 1000)}
                mine = sorted(left & present)
                if mine:
                    moved.extend(await dlq.redrive(self.sqs, url, self.sources[name], name, message_ids=mine))
                    left -= set(mine)
            self._counts = None
            if left:
                raise ConfigurationError(f"not in a DLQ (redriven already?): {', '.join(sorted(left))}")
            return moved
