"""Spending limits, checked before every model call of a step.

Three limits (each ``None``: unlimited): model calls of one thread since its last user text — for a
child thread, since its parent's last message — (``max_model_calls_per_turn``), and the tokens and dollars the whole conversation — the root thread and
every thread under it, compaction included — has spent (``max_conversation_tokens``,
``max_conversation_cost_usd``).

Guarantees:

- **Exact and free.** The per-turn count is kept on the thread's head and the conversation's spend with the
  root's metadata; the step reads both with the reads it makes anyway and updates them in the same commit
  as its rows, so a crash or a redelivery never counts a call twice and the check adds no store request.
  Within a step, the calls and tokens of the step so far are added to what was read.
- **Before, never after.** A limit is checked before a model call; a call already running finishes. A
  limit is reached when what was used is at least the limit: with a limit of 3 model calls, 3 calls run
  and the fourth does not.
- **Order.** When several are reached, the per-turn count is reported first, then tokens, then cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepagent.events import LimitReached
from stepagent.stores.base import Spend

MODEL_CALLS_PER_TURN = "model_calls_per_turn"
CONVERSATION_TOKENS = "conversation_tokens"
CONVERSATION_COST_USD = "conversation_cost_usd"


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits one thread runs under (``None`` fields: unlimited)."""

    max_model_calls_per_turn: int | None = None
    max_conversation_tokens: int | None = None
    max_conversation_cost_usd: float | None = None

    def reached(self, *, model_calls: int, spend: Spend) -> LimitReached | None:
        """The first limit that ``model_calls`` (this thread's, this turn) or ``spend`` (the
        conversation's) has reached, or ``None`` when another model call may run."""
        calls = self.max_model_calls_per_turn
        if calls is not None and model_calls >= calls:
            return LimitReached(limit=MODEL_CALLS_PER_TURN, value=calls, used=model_calls)
        tokens = self.max_conversation_tokens
        if tokens is not None and spend.tokens >= tokens:
            return LimitReached(limit=CONVERSATION_TOKENS, value=tokens, used=spend.tokens)
        cost = self.max_conversation_cost_usd
        if cost is not None and spend.cost_usd >= cost:
            return LimitReached(limit=CONVERSATION_COST_USD, value=cost, used=round(spend.cost_usd, 6))
        return None

    @property
    def any(self) -> bool:
        return any(
            v is not None
            for v in (
                self.max_model_calls_per_turn,
                self.max_conversation_tokens,
                self.max_conversation_cost_usd,
            )
        )
