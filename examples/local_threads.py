"""A multi-thread conversation in local mode, offline: the scripted model plays both threads.

The root thread delegates to a child thread (``spawn_thread``); the child reports its progress
(``report_to_parent``), then closes itself with a final report (``close_thread``); the root relays both
reports. Everything runs in this process with in-memory stores. Run it with::

    python examples/local_threads.py

Each committed history item is printed as it becomes durable, labelled with its thread; a thread's
lifecycle (live / idle) is printed as it changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import TextIO

from stepagent.events import AgentEvent, TurnCommitted
from stepagent.history_items import (
    AssistantText,
    EventItem,
    HistoryItem,
    ToolCallItem,
    ToolResultItem,
    UserItem,
)
from stepagent.modes.local import Live, LocalAgentSystem
from stepagent.providers.scripted import ScriptedProvider

SCRIPT = Path(__file__).with_name("local_threads_script.json")
ROOT = "root"
QUESTION = "Please find a name for my new project."


class TranscriptPrinter:
    """An observer that prints every committed item, labelled ``root``, ``child 1``, ... by thread."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.labels: dict[str, str] = {ROOT: ROOT}

    def label(self, thread_id: str) -> str:
        if thread_id not in self.labels:
            self.labels[thread_id] = f"child {len(self.labels)}"
        return self.labels[thread_id]

    def on_event(self, thread_id: str, event: AgentEvent) -> None:
        if isinstance(event, TurnCommitted):
            for row in event.rows:
                line = self.describe(row.item)
                if line is not None:
                    print(f"[{self.label(thread_id):>7}] {line}", file=self.out)

    def describe(self, item: HistoryItem) -> str | None:
        match item:
            case UserItem():
                return f"user: {item.text}"
            case AssistantText(text=text):
                return f"assistant: {text}"
            case ToolCallItem(call=call):
                return f"→ {call.name}({json.dumps(call.arguments, ensure_ascii=False)})"
            case ToolResultItem(result=result):
                return f"← {_first_line(result.joined_text())}"
            case EventItem(result=result):
                return f"⇐ {_first_line(result.joined_text())}"
        return None


def _first_line(text: str, limit: int = 100) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


async def main(out: TextIO | None = None) -> int:
    out = out or sys.stdout
    printer = TranscriptPrinter(out)
    system = LocalAgentSystem.create(ScriptedProvider(SCRIPT), observer=printer)
    async with system:

        async def show_lifecycle() -> None:
            while True:
                event = await system.next_lifecycle_event()
                state = "live" if isinstance(event, Live) else "idle"
                print(f"[{printer.label(event.thread_id):>7}] · {state}", file=out)

        watcher = asyncio.create_task(show_lifecycle())
        await system.send_user_text(ROOT, QUESTION)
        await system.wait_idle(timeout=30)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        while (event := system.try_next_lifecycle_event()) is not None:  # printed by nobody yet
            state = "live" if isinstance(event, Live) else "idle"
            print(f"[{printer.label(event.thread_id):>7}] · {state}", file=out)
    print(f"done: {len(printer.labels)} threads, all idle", file=out)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
