"""A question an MCP server asks the user during a tool call (elicitation), and the answer, as plain values.

- :class:`InputQuestion` — what the user is asked: ``message`` and either ``requested_schema`` (a JSON
  Schema of the form to fill) or ``url`` (a page to open).
- :class:`InputAnswer` — ``accept`` (with ``content`` for a form), ``decline`` or ``cancel``.
- :class:`PendingInput` — a 2026-07-28 server's question: the call is over on the server's side; it is
  resumed by a fresh request carrying the answer under ``key`` and the server's opaque ``request_state``
  (:class:`Resume`), so the caller can keep it durably and nothing runs while the user thinks.
- :data:`Ask` — how a handshake-era server's question reaches the user while its session stays open.

The JSON forms (:meth:`PendingInput.to_json`, :meth:`Resume.to_json`) are what the tool runner queues
and the state store keeps; they never carry anything but what the server sent and the user answered.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

ElicitationAction = Literal["accept", "decline", "cancel"]
ACTIONS: tuple[ElicitationAction, ...] = ("accept", "decline", "cancel")


@dataclass(frozen=True, slots=True)
class InputQuestion:
    """What a server asks the user: a form (``requested_schema``) or a page to open (``url``)."""

    message: str
    requested_schema: dict[str, Any] | None = None
    url: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"message": self.message}
        if self.url is not None:
            out["url"] = self.url
        else:
            out["requested_schema"] = self.requested_schema or {"type": "object", "properties": {}}
        return out


@dataclass(frozen=True, slots=True)
class InputAnswer:
    """The user's answer: ``accept`` (a form's ``content``), ``decline`` or ``cancel``."""

    action: ElicitationAction
    content: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.action}
        if self.content is not None:
            out["content"] = self.content
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> InputAnswer:
        action = raw.get("action")
        if action not in ACTIONS:
            raise ValueError(f"an answer's action must be one of {', '.join(ACTIONS)}, got {action!r}")
        content = raw.get("content")
        return cls(cast(ElicitationAction, action), content if isinstance(content, dict) else None)


def question_key(thread_id: str, tool_call_id: str) -> str:
    """Where the state store keeps the question of call ``tool_call_id`` of ``thread_id`` and its answer."""
    return f"mcp-input#{thread_id}#{tool_call_id}"


#: Puts a handshake-era server's question to the user and waits for the answer.
Ask = Callable[[InputQuestion], Awaitable[InputAnswer]]


@dataclass(frozen=True, slots=True)
class PendingInput:
    """A 2026-07-28 server's question; the call resumes with :class:`Resume` (same ``key`` and state)."""

    question: InputQuestion
    key: str
    request_state: str | None

    def resume(self, answer: InputAnswer) -> Resume:
        return Resume(key=self.key, request_state=self.request_state, answer=answer)


@dataclass(frozen=True, slots=True)
class Resume:
    """What a resumed call carries: the answer to the question under ``key``, and the server's state."""

    key: str
    request_state: str | None
    answer: InputAnswer

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "request_state": self.request_state, "answer": self.answer.to_json()}

    @classmethod
    def from_json(cls, raw: Any) -> Resume:
        if not isinstance(raw, dict) or not isinstance(raw.get("key"), str):
            raise ValueError("a resumed call needs 'key' (a string) and 'answer'")
        state = raw.get("request_state")
        answer = raw.get("answer")
        if not isinstance(answer, dict):
            raise ValueError("a resumed call needs 'answer' (an object)")
        return cls(
            key=raw["key"],
            request_state=state if isinstance(state, str) else None,
            answer=InputAnswer.from_json(answer),
        )


def question_of(params: Any) -> InputQuestion:
    """The question in an SDK ``ElicitRequestFormParams`` / ``ElicitRequestURLParams``."""
    if getattr(params, "mode", None) == "url":
        return InputQuestion(message=str(params.message), url=str(params.url))
    schema = getattr(params, "requested_schema", None)
    if schema is not None and not isinstance(schema, dict):
        schema = schema.model_dump(by_alias=True, exclude_none=True, mode="json")
    return InputQuestion(message=str(params.message), requested_schema=schema)


def elicit_result(answer: InputAnswer) -> Any:
    """The SDK's ``ElicitResult`` for ``answer``."""
    from mcp_types import ElicitResult

    return ElicitResult(action=answer.action, content=answer.content if answer.action == "accept" else None)


def pending_input(result: Any, tool: str) -> PendingInput | None:
    """The first question of an SDK ``InputRequiredResult`` (``None``: it carries state alone). A request
    this runtime cannot answer (sampling, roots) is a ``ToolError``."""
    from mcp_types import ElicitRequest

    from stepagent.errors import ToolError

    requests = dict(result.input_requests or {})
    for key in sorted(requests):
        request = requests[key]
        if not isinstance(request, ElicitRequest):
            method = getattr(request, "method", type(request).__name__)
            raise ToolError(f"MCP tool '{tool}' asks for {method}, which stepagent does not offer")
    if not requests:
        return None
    key = sorted(requests)[0]
    return PendingInput(
        question=question_of(requests[key].params), key=key, request_state=result.request_state
    )
