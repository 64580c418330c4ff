"""``TurnBuffer``: the assistant output a model call is streaming, before it reaches a thread's history.

What it guarantees:

- **Assistant output only.** It holds text, reasoning and tool calls; anything else is a bug
  (:class:`~stepagent.errors.InvariantViolation`).
- **Coalesced text.** Consecutive text chunks become one item under the first chunk's id, so a turn's
  rows do not depend on how the provider split its stream.
- **Nothing trails on reasoning.** :meth:`take` with ``trim_reasoning`` drops trailing reasoning and blank
  text: a committed turn never ends on them. What it takes is gone from the buffer;
  :meth:`~stepagent.core.history.HistoryManager.flush_turn` appends it to history, which refuses appends
  and commits while the buffer still holds content.
"""

from __future__ import annotations

from stepagent.errors import InvariantViolation
from stepagent.history_items import AssistantText, HistoryItem, Reasoning, ToolCallItem


class TurnBuffer:
    """The streamed, not yet flushed part of one model call's turn (see the module docstring)."""

    def __init__(self) -> None:
        self._items: list[tuple[HistoryItem, str]] = []

    def add(self, item: HistoryItem, completion_id: str) -> None:
        """Buffer one streamed assistant item. Consecutive text coalesces into the first chunk's item."""
        if not isinstance(item, AssistantText | Reasoning | ToolCallItem):
            raise InvariantViolation(f"bug: {type(item).__name__} is not assistant output")
        turn = self._items
        if isinstance(item, AssistantText) and turn and isinstance(turn[-1][0], AssistantText):
            previous, first_id = turn[-1]
            assert isinstance(previous, AssistantText)
            turn[-1] = (AssistantText(previous.text + item.text), first_id)
            return
        turn.append((item, completion_id))

    def take(self, *, trim_reasoning: bool = False) -> list[tuple[HistoryItem, str]]:
        """Empty the buffer, returning what it held (minus trailing reasoning and blank text if asked)."""
        turn, self._items = self._items, []
        while (
            trim_reasoning
            and turn
            and (
                isinstance(turn[-1][0], Reasoning)
                or (isinstance(last := turn[-1][0], AssistantText) and not last.text.strip())
            )
        ):
            turn.pop()
        return turn

    def discard(self) -> None:
        """Drop the partial turn (a retried or abandoned model call)."""
        self._items.clear()

    @property
    def is_empty(self) -> bool:
        return not self._items

    def items(self) -> list[HistoryItem]:
        """The buffered items, in order."""
        return [item for item, _ in self._items]
