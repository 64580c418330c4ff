"""The wire model: ``InputMessage``, its content kinds and synthetic kinds.

Every input to a thread is one ``InputMessage`` (the SQS body). The JSON is compatible with the reference
runtime in both directions: its own examples parse, and what we emit parses there. Content is tagged by
``type`` (``text``, ``image``, ``audio``, ``video``, ``document``, ``toolresult``, ``oauth_required``,
``user_choice_required``, ``approval``, ``input_required``, ``elicitation``, ``oauth_complete``); ``synthetic`` is a tagged object or the legacy bare string (a non-associative
subscription event). The optional ``id`` is our extension: the logical message id used for dedup.

:func:`parse_input_message` is the only entry point for untrusted bodies; it checks every rule of
:mod:`stepagent.input_rules` (JSON, depth, characters, sizes, ids) and raises
:class:`~stepagent.errors.MalformedMessageError` naming the field and the reason.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from stepagent.errors import MalformedMessageError
from stepagent.formats import FORMAT_FIELD, check_version
from stepagent.input_rules import check_id, check_json, check_metadata, check_size, load_json


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


# ----------------------------------------------------------------------------------------------------------
# Content blocks (inside tool results, and user content)


class TextBlock(_Model):
    """A text block of a tool result (wire ``type`` ``text``)."""

    type: Literal["text"] = "text"
    text: str


class ImageBlock(_Model):
    """A base64 image. Accepts ``data`` as a string or rig's ``{"type":"base64","value":...}`` object,
    and ``media_type`` or RAP's camelCase ``mediaType``."""

    type: Literal["image"] = "image"
    data: str
    media_type: str | None = Field(default=None, alias="media_type")

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            raw = dict(raw)
            data = raw.get("data")
            if isinstance(data, dict) and "value" in data:
                raw["data"] = data["value"]
            if "media_type" not in raw and "mediaType" in raw:
                raw["media_type"] = raw.pop("mediaType")
        return raw

    @model_serializer
    def _dump(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "image", "data": self.data}
        if self.media_type is not None:
            out["media_type"] = self.media_type
        return out


ResultBlock = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]


class ToolResult(_Model):
    """A tool call's answer: ``id`` matches the call's ``id``; ``call_id`` is the provider's secondary id."""

    type: Literal["toolresult"] = "toolresult"
    id: str
    call_id: str | None = None
    content: list[ResultBlock] = Field(min_length=1)

    @model_serializer
    def _dump(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "toolresult", "id": self.id}
        if self.call_id is not None:
            out["call_id"] = self.call_id
        out["content"] = [block.model_dump() for block in self.content]
        return out

    @classmethod
    def text(cls, tool_call_id: str, text: str, call_id: str | None = None) -> ToolResult:
        return cls(id=tool_call_id, call_id=call_id, content=[TextBlock(text=text)])

    def first_text(self) -> str | None:
        first = self.content[0]
        return first.text if isinstance(first, TextBlock) else None

    def joined_text(self) -> str:
        return "\n".join(b.text for b in self.content if isinstance(b, TextBlock))

    def with_id(self, new_id: str, call_id: str | None = None) -> ToolResult:
        return ToolResult(id=new_id, call_id=call_id, content=list(self.content))


class ToolCall(_Model):
    """A model's tool call. Serialised in the reference's rig shape (``function.name/arguments``)."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    call_id: str | None = None
    signature: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_rig(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and "function" in raw:
            function = raw["function"] or {}
            raw = {k: v for k, v in raw.items() if k != "function"}
            raw["name"] = function.get("name")
            raw["arguments"] = function.get("arguments", {})
        return raw

    @model_serializer
    def _dump(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "call_id": self.call_id,
            "function": {"name": self.name, "arguments": self.arguments},
            "signature": self.signature,
            "additional_params": None,
        }


# ----------------------------------------------------------------------------------------------------------
# User content kinds


class TextContent(_Model):
    """User text (wire ``type`` ``text``)."""

    type: Literal["text"] = "text"
    text: str


class ImageContent(ImageBlock):
    """A user image (wire ``type`` ``image``): an :class:`ImageBlock` as user content."""

    pass


class MediaContent(_Model):
    """Audio, video or document user content: stored as given, never interpreted by the runtime."""

    model_config = ConfigDict(frozen=True, extra="allow")
    type: Literal["audio", "video", "document"]


class OAuthRequired(_Model):
    """A tool needs the user to authorise at ``auth_url``. Never enters history."""

    type: Literal["oauth_required"] = "oauth_required"
    id: str
    call_id: str | None = None
    auth_url: str


class UserChoiceRequired(_Model):
    """A tool asks the user to pick one of ``choices``; the answer is POSTed to ``response_url``."""

    type: Literal["user_choice_required"] = "user_choice_required"
    id: str
    call_id: str | None = None
    prompt: str
    choices: list[str] = Field(min_length=1)
    default: int = 0
    response_url: str

    @model_validator(mode="after")
    def _default_in_range(self) -> UserChoiceRequired:
        if not 0 <= self.default < len(self.choices):
            raise ValueError(f"default {self.default} is not a valid index into {len(self.choices)} choices")
        return self


ApprovalDecisionKind = Literal["approve", "edit", "reject", "respond"]


class ApprovalDecision(_Model):
    """A person's answer to a tool call waiting for approval (wire ``type`` ``approval``): ``approve`` runs
    the call as made, ``edit`` runs it with ``args``, ``reject`` answers it with a refusal (plus
    ``message``), ``respond`` answers it with ``message`` and the tool never runs. Never enters history
    as user content."""

    type: Literal["approval"] = "approval"
    tool_call_id: str = Field(min_length=1)
    decision: ApprovalDecisionKind
    args: dict[str, Any] | None = None
    message: str | None = None

    @model_validator(mode="after")
    def _fields_fit_the_decision(self) -> ApprovalDecision:
        if self.decision == "edit" and self.args is None:
            raise ValueError("an 'edit' decision needs 'args' (the call's new arguments, a JSON object)")
        if self.decision == "respond" and not (self.message or "").strip():
            raise ValueError("a 'respond' decision needs 'message' (the answer the model gets instead)")
        return self


class InputRequired(_Model):
    """An MCP server asks the user a question during tool call ``id`` (sent by the tool runner; wire
    ``type`` ``input_required``). ``message`` and a form's ``requested_schema`` or a page's ``url``;
    ``era`` says how the call continues: ``stateless`` (a 2026-07-28 server: the call is re-sent with the
    answer under ``key`` and the server's opaque ``request_state``) or ``session`` (an older server: the
    tool runner holds the call open and reads the answer). Never enters history."""

    type: Literal["input_required"] = "input_required"
    id: str
    call_id: str | None = None
    message: str
    requested_schema: dict[str, Any] | None = None
    url: str | None = None
    era: Literal["stateless", "session"] = "stateless"
    key: str | None = None
    request_state: str | None = None
    round: int = Field(default=1, ge=1)


ElicitationActionKind = Literal["accept", "decline", "cancel"]


class ElicitationAnswer(_Model):
    """A person's answer to a tool's question (wire ``type`` ``elicitation``): ``accept`` with the form's
    ``content``, ``decline`` or ``cancel``. Never enters history as user content."""

    type: Literal["elicitation"] = "elicitation"
    tool_call_id: str = Field(min_length=1)
    action: ElicitationActionKind
    content: dict[str, Any] | None = None


class OAuthComplete(_Model):
    """A person finished (or refused) the sign-in an MCP server's call ``tool_call_id`` waits for (wire
    ``type`` ``oauth_complete``; sent by the HTTP API's OAuth callback, never by a person): ``signed_in``
    re-dispatches the call (with ``resume``, the call's continuation if it had one), ``declined`` ends it
    with an error the model sees. ``round`` counts the call's sign-ins. Never enters history as content."""

    type: Literal["oauth_complete"] = "oauth_complete"
    tool_call_id: str = Field(min_length=1)
    outcome: Literal["signed_in", "declined"]
    server: str = Field(min_length=1)
    round: int = Field(default=1, ge=1)
    resume: dict[str, Any] | None = None


UserContent = Annotated[TextContent | ImageContent | MediaContent, Field(discriminator="type")]
Content = Annotated[
    TextContent
    | ImageContent
    | MediaContent
    | ToolResult
    | OAuthRequired
    | UserChoiceRequired
    | ApprovalDecision
    | InputRequired
    | ElicitationAnswer
    | OAuthComplete,
    Field(discriminator="type"),
]


# ----------------------------------------------------------------------------------------------------------
# Synthetic kinds


class SubscriptionEvent(_Model):
    """An event of the subscription started by tool call ``tool_call_id`` (``subscription_event``).

    An ``associative`` event is inlined into the subscribing thread, the others go to an event child thread;
    ``final`` ends the subscription."""

    type: Literal["subscription_event"] = "subscription_event"
    tool_call_id: str
    associative: bool = False
    final: bool = False


class ThreadReport(_Model):
    """A child thread's report to its parent (``thread_report``); ``tool_call_id`` is the spawning call."""

    type: Literal["thread_report"] = "thread_report"
    tool_call_id: str
    child_thread_id: str


class ParentMessage(_Model):
    """A message from a thread's parent (``parent_message``); ``tool_call_id`` is the call that spawned
    the child."""

    type: Literal["parent_message"] = "parent_message"
    tool_call_id: str


class Compaction(_Model):
    """A request to compact the receiving thread (``compaction``)."""

    type: Literal["compaction"] = "compaction"


class CompactionComplete(_Model):
    """The thread's compaction child has finished (``compaction_complete``): apply its summary."""

    type: Literal["compaction_complete"] = "compaction_complete"


Synthetic = Annotated[
    SubscriptionEvent | ThreadReport | ParentMessage | Compaction | CompactionComplete,
    Field(discriminator="type"),
]

#: Synthetic kinds injected into the receiving thread as a ``receive_event__injected`` call/result pair.
INLINE_SYNTHETIC = (ThreadReport, ParentMessage)


def is_inline_synthetic(synthetic: object) -> bool:
    """Thread reports, parent messages and associative subscription events are inlined."""
    if isinstance(synthetic, INLINE_SYNTHETIC):
        return True
    return isinstance(synthetic, SubscriptionEvent) and synthetic.associative


def is_deferrable_synthetic(synthetic: object) -> bool:
    """Events that wait for a pending non-passive tool call instead of interrupting it: the inline kinds.
    A non-associative subscription event is not held back — it runs in its own child thread and never
    touches the waiting thread's history."""
    return is_inline_synthetic(synthetic)


# ----------------------------------------------------------------------------------------------------------
# The message


class InputMessage(_Model):
    """One input to one thread (``group_id``)."""

    content: Content
    group_id: str = Field(min_length=1)
    metadata: Any = None
    synthetic: Synthetic | None = None
    display_as: list[dict[str, Any]] | None = None
    subscription: bool = False
    id: str | None = Field(default=None, min_length=1)

    @field_validator("synthetic", mode="before")
    @classmethod
    def _legacy_synthetic(cls, raw: Any) -> Any:
        # The reference's legacy form: a bare string is a non-associative subscription event.
        if isinstance(raw, str):
            return {"type": "subscription_event", "tool_call_id": raw}
        return raw

    @field_validator("display_as")
    @classmethod
    def _segments_are_typed(cls, segments: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for index, segment in enumerate(segments or []):
            if not isinstance(segment.get("type"), str):
                raise ValueError(f"segment {index} needs a string 'type'")
        return segments

    @field_validator("synthetic")
    @classmethod
    def _synthetic_shape(cls, synthetic: Any, info: ValidationInfo) -> Any:
        # A field validator (``content`` is validated first) so the error names the ``synthetic`` field.
        content = info.data.get("content")
        if (
            isinstance(synthetic, SubscriptionEvent | ThreadReport | ParentMessage)
            and content is not None
            and not isinstance(content, ToolResult)
        ):
            raise ValueError(f"a synthetic {synthetic.type} message must carry a toolresult content")
        return synthetic

    @model_serializer
    def _dump(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "content": self.content.model_dump(),
            "group_id": self.group_id,
            "metadata": self.metadata,
            "synthetic": self.synthetic.model_dump() if self.synthetic is not None else None,
            "display_as": self.display_as,
            "subscription": self.subscription,
        }
        if self.id is not None:
            out["id"] = self.id
        return out

    # ---- constructors ----------------------------------------------------------------------------------

    @classmethod
    def user_text(
        cls, group_id: str, text: str, *, id: str | None = None, metadata: Any = None
    ) -> InputMessage:
        return cls(content=TextContent(text=text), group_id=group_id, id=id, metadata=metadata)

    @classmethod
    def tool_result(
        cls, group_id: str, result: ToolResult, *, synthetic: Any = None, subscription: bool = False
    ) -> InputMessage:
        return cls(content=result, group_id=group_id, synthetic=synthetic, subscription=subscription)

    # ---- predicates ------------------------------------------------------------------------------------

    @property
    def is_user_text(self) -> bool:
        return self.synthetic is None and isinstance(self.content, TextContent)

    @classmethod
    def approval(
        cls,
        group_id: str,
        tool_call_id: str,
        decision: str = "approve",
        *,
        args: dict[str, Any] | None = None,
        message: str | None = None,
        id: str | None = None,
    ) -> InputMessage:
        content = ApprovalDecision.model_validate(
            {"tool_call_id": tool_call_id, "decision": decision, "args": args, "message": message}
        )
        return cls(content=content, group_id=group_id, id=id)

    @classmethod
    def elicitation(
        cls,
        group_id: str,
        tool_call_id: str,
        action: str,
        content: dict[str, Any] | None = None,
        *,
        id: str | None = None,
    ) -> InputMessage:
        answer = ElicitationAnswer.model_validate(
            {"tool_call_id": tool_call_id, "action": action, "content": content}
        )
        return cls(content=answer, group_id=group_id, id=id)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), ensure_ascii=False, separators=(",", ":"))


_INPUT_ADAPTER: TypeAdapter[InputMessage] = TypeAdapter(InputMessage)


_UNION_TAGS = frozenset(
    {
        "text",
        "image",
        "audio",
        "video",
        "document",
        "toolresult",
        "oauth_required",
        "user_choice_required",
        "approval",
        "input_required",
        "elicitation",
        "oauth_complete",
        "subscription_event",
        "thread_report",
        "parent_message",
        "compaction",
        "compaction_complete",
    }
)


def _describe(error: ValidationError) -> tuple[str, str]:
    """The first error as (dotted field path, reason), without pydantic's union-tag path segments."""
    first = error.errors()[0]
    parts: list[str] = []
    previous: object = None
    for part in first["loc"]:
        is_tag = isinstance(part, str) and (part in _UNION_TAGS or part.startswith("function-"))
        if not (is_tag and (previous in ("content", "synthetic") or isinstance(previous, int))):
            parts.append(str(part))
        previous = part
    return ".".join(parts) or "(message)", str(first["msg"])


#: The answers only a person (or, for a sign-in, the HTTP API's callback) gives, and what refusing one that
#: came as a synthetic message says.
_NEVER_SYNTHETIC: dict[type[BaseModel], str] = {
    OAuthComplete: "a sign-in's completion is never synthetic",
    ElicitationAnswer: "an elicitation answer is a person's, never synthetic",
    ApprovalDecision: "an approval is a person's answer, never synthetic",
}


def check_input_fields(message: InputMessage) -> None:
    """The id and metadata rules of :mod:`stepagent.input_rules` for a message built from untrusted data."""
    check_id(message.id, "id")
    check_id(message.group_id, "group_id")
    content = message.content
    if isinstance(content, ToolResult | OAuthRequired | UserChoiceRequired | InputRequired):
        check_id(content.id, "content.id")
        check_id(content.call_id, "content.call_id")
    if isinstance(content, OAuthComplete | ElicitationAnswer | ApprovalDecision):
        check_id(content.tool_call_id, "content.tool_call_id")
        if message.synthetic is not None:
            raise MalformedMessageError(
                f"invalid input message: synthetic: {_NEVER_SYNTHETIC[type(content)]}", field="synthetic"
            )
    synthetic = message.synthetic
    if isinstance(synthetic, SubscriptionEvent | ThreadReport | ParentMessage):
        check_id(synthetic.tool_call_id, "synthetic.tool_call_id")
    if isinstance(synthetic, ThreadReport):
        check_id(synthetic.child_thread_id, "synthetic.child_thread_id")
    check_metadata(message.metadata)


def parse_input_message(body: str | bytes | dict[str, Any]) -> InputMessage:
    """Parse an untrusted message body; raise ``MalformedMessageError`` (or ``PayloadTooLargeError``)
    naming the field and the reason. Every rule of :mod:`stepagent.input_rules` is checked here."""
    if isinstance(body, bytes | str):
        check_size(body)
        raw = load_json(body)
    else:
        raw = body
    if not isinstance(raw, dict):
        raise MalformedMessageError(f"message body must be a JSON object, got {type(raw).__name__}")
    check_version(raw.get(FORMAT_FIELD), "this input message")  # before reading anything else of it
    check_json(raw, "input message")
    try:
        message = _INPUT_ADAPTER.validate_python(raw)
    except ValidationError as exc:
        field, reason = _describe(exc)
        raise MalformedMessageError(f"invalid input message: {field}: {reason}", field=field) from None
    check_input_fields(message)
    return message
