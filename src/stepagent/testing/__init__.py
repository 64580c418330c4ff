"""Testing agents offline, in one process, with step-mode semantics and no AWS (public API).

- :func:`run_conversation` / :func:`arun_conversation` — a whole conversation in one call with the scripted
  model, any provider, or a Python function as the model; returns a :class:`Transcript` to assert on
  (:mod:`stepagent.testing.conversation`).
- :class:`InProcessQueueDriver` — an in-memory queue feeding ``AgentSystem.step`` batch after batch until
  no thread has work left (:mod:`stepagent.testing.inprocess`).

Pair it with the scripted model (``scripted:<path>``, :class:`~stepagent.providers.scripted.ScriptedProvider`)
and the in-memory stores (:func:`~stepagent.stores.memory.memory_stores`) for deterministic tests; the
README's "Testing an agent offline" section shows a complete test. The runtime never imports this package.
"""

from stepagent.testing.conversation import (
    Call,
    ConversationFailed,
    FunctionModelProvider,
    ModelTurn,
    Transcript,
    arun_conversation,
    run_conversation,
)
from stepagent.testing.inprocess import InProcessQueueDriver

__all__ = [
    "Call",
    "ConversationFailed",
    "FunctionModelProvider",
    "InProcessQueueDriver",
    "ModelTurn",
    "Transcript",
    "arun_conversation",
    "run_conversation",
]
