"""RAP wire types: the toolset manifest, the invocation, and the callbacks (docs/writing-tools.md).

Guarantees:

- Parsing is strict where the runtime depends on a field (ids, ``group_id``, URLs, choice indexes) and
  lenient elsewhere: unknown fields are ignored, as the spec's forward compatibility asks.
- :func:`parse_manifest` validates a manifest as the spec requires (name, a valid http(s) endpoint, at
  least one tool, each tool with a name, description and object schema, names unique within the toolset)
  and reports the first problem as a :class:`RapManifestError` naming the server and the field.
- :meth:`RapInvocation.body` is the reference's exact JSON shape: ``call_id`` and ``thread_ancestors``
  are always present (``null`` when absent), ``user_id`` is omitted when absent.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from stepagent.errors import ConfigurationError

#: What every supported model provider accepts as a tool name.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: Image media types a model can be given; any other ``mediaType`` is dropped (the reference maps unknown
#: types to none), keeping the image data.
IMAGE_MEDIA_TYPES = frozenset(
    {"image/png", "image/jpeg", "image/gif", "image/webp", "image/heic", "image/heif", "image/svg+xml"}
)


def is_http_url(value: str) -> bool:
    """Whether ``value`` is an absolute http(s) URL (a scheme and a host)."""
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def _http_url(value: str) -> str:
    if not is_http_url(value):
        raise ValueError(f"{value!r} is not an http(s) URL")
    return value


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


# ----------------------------------------------------------------------------------------------------------
# Manifest


class ToolDef(_Wire):
    """One tool of a RAP toolset manifest (wire keys ``inputSchema``, ``displayScript``); its name is one
    every model API accepts and its schema is of type ``object``."""

    name: str = Field(min_length=1, max_length=128)
    description: str = Field(min_length=1)
    input_schema: dict[str, Any] = Field(alias="inputSchema")
    annotations: dict[str, Any] | None = None
    display_script: str | None = Field(default=None, alias="displayScript")

    @field_validator("name")
    @classmethod
    def _provider_safe(cls, name: str) -> str:
        if not TOOL_NAME.match(name):
            raise ValueError(f"{name!r} must be 1-64 letters, digits, '_' or '-' (what model APIs accept)")
        return name

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        if schema.get("type", "object") != "object":
            raise ValueError("must be a JSON Schema of type 'object'")
        return schema


class ToolsetManifest(_Wire):
    """A RAP server's toolset manifest: name, invocation endpoint and tools (at least one, unique names)."""

    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    endpoint: str
    tools: list[ToolDef] = Field(min_length=1)
    needs_migration: bool = Field(default=False, alias="needsMigration")

    _endpoint = field_validator("endpoint")(_http_url)

    @field_validator("tools")
    @classmethod
    def _unique(cls, tools: list[ToolDef]) -> list[ToolDef]:
        seen: set[str] = set()
        for tool in tools:
            if tool.name in seen:
                raise ValueError(f"two tools are named {tool.name!r}")
            seen.add(tool.name)
        return tools

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)


class RapManifestError(ConfigurationError):
    """A RAP server's toolset could not be loaded (unreachable, not JSON, or invalid)."""


def _location(error: ValidationError) -> str:
    first = error.errors()[0]
    path = ""
    for part in first["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return f"{path or '(manifest)'}: {first['msg']}"


def parse_manifest(server: str, data: Any) -> ToolsetManifest:
    """Validate a decoded manifest of ``server``; raise :class:`RapManifestError` naming the field."""
    if not isinstance(data, dict):
        raise RapManifestError(f"RAP server {server}: the toolset manifest must be a JSON object")
    try:
        return ToolsetManifest.model_validate(data)
    except ValidationError as exc:
        raise RapManifestError(f"RAP server {server}: invalid toolset manifest: {_location(exc)}") from None


# ----------------------------------------------------------------------------------------------------------
# Invocation


class RapInvocation(_Wire):
    """A RAP invocation: what the runtime POSTs to a tool server to call ``operation`` (wire shape:
    :meth:`body`)."""

    operation: str = Field(min_length=1)
    arguments: Any = None
    id: str = Field(min_length=1)
    call_id: str | None = None
    callback_url: str
    group_id: str = Field(min_length=1)
    user_id: str | None = None
    thread_ancestors: list[str] | None = None

    _callback = field_validator("callback_url")(_http_url)

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "operation": self.operation,
            "arguments": self.arguments,
            "id": self.id,
            "call_id": self.call_id,
            "callback_url": self.callback_url,
            "group_id": self.group_id,
        }
        if self.user_id is not None:
            out["user_id"] = self.user_id
        out["thread_ancestors"] = self.thread_ancestors
        return out


# ----------------------------------------------------------------------------------------------------------
# Callbacks


class TextItem(_Wire):
    """A text item of a tool result callback's ``content`` (``type`` ``text``)."""

    type: Literal["text"] = "text"
    text: str


class ImageItem(_Wire):
    """A base64 image item of a tool result callback's ``content`` (``type`` ``image``, ``mediaType`` on
    the wire)."""

    type: Literal["image"] = "image"
    data: str = Field(min_length=1)
    media_type: str | None = Field(default=None, alias="mediaType")


ContentItem = Annotated[TextItem | ImageItem, Field(discriminator="type")]


class _Segments(_Wire):
    display_as: list[dict[str, Any]] | None = None

    @field_validator("display_as")
    @classmethod
    def _typed(cls, segments: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for index, segment in enumerate(segments or []):
            if not isinstance(segment.get("type"), str):
                raise ValueError(f"segment {index} needs a string 'type'")
        return segments


class ToolResultCallback(_Segments):
    """The ``tool_result`` callback: the result of call ``id``; ``subscription`` says the call started a
    subscription."""

    type: Literal["tool_result"]
    group_id: str = Field(min_length=1)
    id: str = Field(min_length=1)
    call_id: str | None = None
    text: str | None = None
    content: list[ContentItem] | None = None
    subscription: bool = False


class SubscriptionEventCallback(_Wire):
    """The ``subscription_event`` callback: one event of the subscription started by call ``tool_call_id``."""

    type: Literal["subscription_event"]
    group_id: str = Field(min_length=1)
    tool_call_id: str = Field(min_length=1)
    text: str
    associative: bool = False
    final: bool = False
    #: Extension: the tool's own id for this event. When given, the dedup id derives from it, so two
    #: events with equal text stay distinct and a retried POST of one event is still one event.
    event_id: str | None = Field(default=None, min_length=1)


class OAuthCallback(_Wire):
    """The ``oauth`` callback: call ``id`` needs the user to authorise at ``auth_url``."""

    type: Literal["oauth"]
    group_id: str = Field(min_length=1)
    id: str = Field(min_length=1)
    call_id: str | None = None
    auth_url: str

    _url = field_validator("auth_url")(_http_url)


class UserChoiceCallback(_Wire):
    """The ``user_choice`` callback: call ``id`` asks the user to pick one of ``choices``; the answer is
    POSTed to ``response_url``."""

    type: Literal["user_choice"]
    group_id: str = Field(min_length=1)
    id: str = Field(min_length=1)
    call_id: str | None = None
    prompt: str
    choices: list[str] = Field(min_length=1)
    default: int = 0
    response_url: str

    _url = field_validator("response_url")(_http_url)

    @model_validator(mode="after")
    def _default_in_range(self) -> UserChoiceCallback:
        if not 0 <= self.default < len(self.choices):
            raise ValueError(f"default {self.default} is not a valid index into {len(self.choices)} choices")
        return self


class ViewUpdateCallback(_Wire):
    """The ``view_update`` callback: the latest content of one view of a thread (``view_type``)."""

    type: Literal["view_update"]
    group_id: str = Field(min_length=1)
    view_type: str = Field(min_length=1)
    content: dict[str, Any] | None = None


RapCallback = Annotated[
    ToolResultCallback | SubscriptionEventCallback | OAuthCallback | UserChoiceCallback | ViewUpdateCallback,
    Field(discriminator="type"),
]
CALLBACK_ADAPTER: TypeAdapter[RapCallback] = TypeAdapter(RapCallback)
CALLBACK_TYPES = ("tool_result", "subscription_event", "oauth", "user_choice", "view_update")


def describe_validation_error(error: ValidationError) -> str:
    """The first problem as ``field: reason``, without pydantic's union-tag path segment."""
    first = error.errors()[0]
    parts = [str(p) for p in first["loc"] if p not in CALLBACK_TYPES]
    return f"{'.'.join(parts) or '(body)'}: {first['msg']}"
