"""A person finished the sign-in an MCP server's call waits for (``oauth_complete``, sent by the HTTP API's
OAuth callback): the call continues.

The tool runner found no usable token for the call's owner, sent ``oauth_required`` and ended its run
without a result, so the thread keeps the call open and nothing runs while the person signs in. What
this module guarantees when the completion arrives:

- **Only the waiting call continues.** A completion for a call that is not this thread's pending call
  (answered, interrupted, unknown) is refused with an :class:`~stepagent.events.InputRejected` and
  changes nothing.
- **``signed_in`` re-dispatches the call durably, at most once.** The call's dispatch intent (carrying
  the call's continuation, if it had one) is committed with the completion's processed id; the outbox
  (``core/effects.py``) sends it after the commit, and a crash anywhere re-drives it rather than losing or
  repeating it. The completion's id is fixed per call and sign-in round (``mcp_oauth.resume_id``), so a
  retried callback, or a second link of the same round, is an already-processed input.
- **``declined`` ends the call with an error the model sees:** ``Error: the user declined to sign in to
  <server>``, as the call's result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stepagent.core.history import HistoryManager
from stepagent.events import AgentEvent, InputRejected
from stepagent.messages import OAuthComplete, ToolResult
from stepagent.stores.base import DispatchIntent


@dataclass(frozen=True, slots=True)
class SignInFolded:
    """What a completion decided: a call to dispatch now, or the call's result (a refusal: neither)."""

    intent: DispatchIntent | None = None
    result: ToolResult | None = None


def declined_text(server: str) -> str:
    """The result a declined sign-in gives the call."""
    return f"Error: the user declined to sign in to {server}"


def fold_sign_in(
    history: HistoryManager, done: OAuthComplete, message_id: str, emit: Callable[[AgentEvent], None]
) -> SignInFolded:
    """Fold a sign-in's completion (see the module docstring). The caller records a ``result`` in history
    under ``message_id``; everything else is recorded here."""
    pending = history.pending_tool_call()
    if pending is None or pending.call.id != done.tool_call_id:
        history.record_processed(message_id)
        reason = (
            f"there is no tool call {done.tool_call_id} waiting for a sign-in to {done.server} in this thread"
        )
        emit(InputRejected(message_id, f"sign-in ignored: {reason}"))
        return SignInFolded()
    call = pending.call
    if done.outcome == "declined":
        return SignInFolded(result=ToolResult.text(call.id, declined_text(done.server), call_id=call.call_id))
    intent = DispatchIntent(call.id, call.name, call.arguments, call.call_id, resume=done.resume)
    history.pending.add_intent(intent)
    history.record_processed(message_id)
    return SignInFolded(intent=intent)
