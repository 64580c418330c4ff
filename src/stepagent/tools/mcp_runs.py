"""One MCP tool call as a function runner makes it, questions to the user included.

:func:`run_mcp_call` is shared by the tool runner Lambda and the in-process runner. It guarantees:

- **2026-07-28 servers: nothing waits.** A question comes back as a
  :class:`~stepagent.tools.mcp_input.PendingInput`; it is sent to the calling thread as an
  ``input_required`` input (with the server's opaque request state, dedup id
  ``<tool call id>-input-<round>``) and the run ends without a result. The person's answer makes the
  thread dispatch the call again with ``resume`` (``core/elicitation.py``), and this function re-sends it
  to the server as a fresh request carrying the answer and the state; the real result follows.
- **Older servers: held at most ``input_wait`` seconds.** Their question arrives while the session is
  open; it is sent to the thread the same way (``era: session``) and the answer is read from the state
  store (where the thread's step keeps it) every :data:`POLL_S` seconds. No answer in time — or no
  store to read — declines, and the server decides what a declined question means.
- **A sign-in is a wait like a question** (``"auth": "oauth"`` servers, :mod:`stepagent.tools.mcp_oauth`).
  The call goes out with the owner's access token (refreshed first when expired). No token, or a 401
  (the token was revoked: it is dropped), sends the thread an ``oauth_required`` input with the
  authorization URL (dedup id ``<tool call id>-oauth-<round>``) and the run ends without a result; the
  API's callback re-dispatches the call once the person has signed in.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from stepagent.errors import ToolError
from stepagent.messages import InputMessage, InputRequired, OAuthRequired
from stepagent.senders.base import InputSender
from stepagent.tools.mcp import McpTool, ServerUnauthorized
from stepagent.tools.mcp_input import InputAnswer, InputQuestion, PendingInput, Resume, question_key
from stepagent.tools.mcp_oauth import (
    OAuthServices,
    SignInError,
    begin_sign_in,
    drop_tokens,
    next_round,
    usable_token,
)

#: How often a held call looks for the person's answer.
POLL_S = 0.5

#: Reads a kept question (``StateStore.cache_get``).
ReadKept = Callable[[str], Awaitable[str | None]]


async def run_mcp_call(
    tool: McpTool,
    arguments: Mapping[str, Any],
    *,
    thread_id: str,
    tool_call_id: str,
    call_id: str | None,
    resume: Mapping[str, Any] | None,
    sender: InputSender,
    read_kept: ReadKept | None,
    input_wait: float,
    owner: str | None = None,
    oauth: OAuthServices | None = None,
) -> str | None:
    """The call's result text (``ToolError`` for a failure), or ``None`` when the server asked the person a
    question, or the person must sign in, and the call continues when they answer (see the module
    docstring)."""
    server = tool.connection.server
    token = None
    if server.auth == "oauth":
        if oauth is None or owner is None:
            raise ToolError(
                f"MCP server '{server.name}' needs the user to sign in, which this runner cannot ask for"
            )
        token = await usable_token(oauth, server, owner)
    try:
        return await _run(
            tool, arguments, thread_id, tool_call_id, call_id, resume, sender, read_kept, input_wait, token
        )
    except ServerUnauthorized as refused:
        if oauth is None or owner is None:
            raise
        if token is not None:
            await drop_tokens(oauth, server, owner)  # revoked or otherwise refused: ask again
        round_no = await next_round(oauth, thread_id, tool_call_id)
        try:
            url = await begin_sign_in(
                oauth,
                server,
                owner,
                thread_id=thread_id,
                tool_call_id=tool_call_id,
                call_id=call_id,
                round_no=round_no,
                challenge=refused.challenge,
                resume=resume,
            )
        except SignInError as error:
            raise ToolError(str(error)) from None
        except Exception as error:  # discovery or registration failed: the model is told, not the queue
            raise ToolError(
                f"MCP server '{server.name}' needs the user to sign in, but its authorization server "
                f"could not be used: {type(error).__name__}: {error}"
            ) from None
        notice = OAuthRequired(id=tool_call_id, call_id=call_id, auth_url=url)
        await sender.send(
            InputMessage(content=notice, group_id=thread_id), f"{tool_call_id}-oauth-{round_no}"
        )
        return None


async def _run(
    tool: McpTool,
    arguments: Mapping[str, Any],
    thread_id: str,
    tool_call_id: str,
    call_id: str | None,
    resume: Mapping[str, Any] | None,
    sender: InputSender,
    read_kept: ReadKept | None,
    input_wait: float,
    token: str | None,
) -> str | None:
    resumed = None if resume is None else Resume.from_json(dict(resume))
    round_no = int(resume.get("round", 1)) + 1 if resume is not None else 1
    asked = 0

    async def ask(question: InputQuestion) -> InputAnswer:
        nonlocal asked
        asked += 1
        if read_kept is None:
            return InputAnswer("decline")
        notice = _notice(question, tool_call_id, call_id, era="session", round_no=asked)
        await sender.send(InputMessage(content=notice, group_id=thread_id), f"{tool_call_id}-ask-{asked}")
        deadline = time.monotonic() + input_wait
        key = question_key(thread_id, tool_call_id)
        while True:
            raw = await read_kept(key)
            answer = _answer_of(raw, asked)
            if answer is not None:
                return answer
            if time.monotonic() >= deadline:
                return InputAnswer("decline")
            await asyncio.sleep(POLL_S)

    outcome = await tool.call(arguments, resume=resumed, ask=ask, ask_wait=input_wait, token=token)
    if not isinstance(outcome, PendingInput):
        return outcome
    notice = _notice(outcome.question, tool_call_id, call_id, era="stateless", round_no=round_no)
    notice = notice.model_copy(update={"key": outcome.key, "request_state": outcome.request_state})
    await sender.send(InputMessage(content=notice, group_id=thread_id), f"{tool_call_id}-input-{round_no}")
    return None


def _notice(
    question: InputQuestion, tool_call_id: str, call_id: str | None, *, era: str, round_no: int
) -> InputRequired:
    return InputRequired.model_validate(
        {
            "id": tool_call_id,
            "call_id": call_id,
            "message": question.message,
            "requested_schema": question.requested_schema if question.url is None else None,
            "url": question.url,
            "era": era,
            "round": round_no,
        }
    )


def _answer_of(raw: str | None, round_no: int) -> InputAnswer | None:
    """The person's answer to question ``round_no`` of a held call, if the thread has stored it."""
    if raw is None:
        return None
    kept = json.loads(raw)
    notice, answer = kept.get("notice") or {}, kept.get("answer")
    if notice.get("era") != "session" or notice.get("round") != round_no or not isinstance(answer, dict):
        return None
    return InputAnswer.from_json(answer)
