"""The strict JSON Schema each vendor's structured output accepts, for a schema generated from a pydantic
model class.

Anthropic's and OpenAI's structured outputs take a subset of JSON Schema (every object closed with
``additionalProperties: false``; OpenAI also wants every property listed in ``required``). Their official
SDKs rewrite a pydantic class's ``model_json_schema()`` into that subset before sending it; these functions
are faithful ports of those rewrites (``anthropic.transform_schema`` and ``openai``'s
``to_strict_json_schema``), so a request for a pydantic class is byte-identical to the SDK's. Ported rather than called: the SDKs
are test-only oracles here (``tests/providers`` checks these functions against them), because importing
them costs a worker ~1.3 s (``anthropic``) and ~0.5 s (``openai``) of CPU, measured on the development
machine, for two pure functions.

Guarantees:

- Pure functions of the schema: the input is never mutated, the result is a fresh JSON-serialisable value.
- A schema the vendor's SDK refuses raises :class:`ProviderError` (not retryable) saying why, the same
  outcome as the vendor rejecting the request.
- Only schemas generated from a pydantic class go through them: a schema the user wrote as a dict is sent as
  given (it is theirs to make valid for the vendor). Either way the answer is validated by stepagent itself
  against the original schema, so the rewrite only shapes what the model is asked for.
"""

from __future__ import annotations

import copy
from typing import Any

from stepagent.errors import ProviderError

# The string formats Anthropic's structured outputs support; another format moves into the description.
_ANTHROPIC_STRING_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6", "uuid"}
)
_MISSING = object()


def anthropic_strict_schema(schema: dict[str, Any], class_name: str) -> dict[str, Any]:
    """``schema`` as the ``anthropic`` SDK sends it for a pydantic class (``output_config.format.schema``)."""
    try:
        return _anthropic(schema)
    except ValueError as exc:
        raise ProviderError(
            f"the output schema of {class_name} cannot be used for Anthropic structured output: {exc}",
            retryable=False,
        ) from None


def openai_strict_schema(schema: dict[str, Any], class_name: str) -> dict[str, Any]:
    """``schema`` as the ``openai`` SDK sends it for a pydantic class (``response_format.json_schema.schema``,
    with ``strict: true``)."""
    root = copy.deepcopy(schema)
    try:
        return _openai(root, root)
    except (ValueError, TypeError, KeyError) as exc:
        raise ProviderError(
            f"the output schema of {class_name} cannot be used for OpenAI structured output: {exc}",
            retryable=False,
        ) from None


def _is_primitive(value: object) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _anthropic(json_schema: dict[str, Any]) -> dict[str, Any]:
    strict: dict[str, Any] = {}
    rest = dict(json_schema)
    # Definitions first, so a root that is only a ``$ref`` keeps them.
    defs = rest.pop("$defs", None)
    if defs is not None:
        strict["$defs"] = {name: _anthropic(sub) for name, sub in defs.items()}
    ref = rest.pop("$ref", None)
    if ref is not None:
        strict["$ref"] = ref
        return strict

    type_ = rest.pop("type", None)
    any_of = rest.pop("anyOf", None)
    one_of = rest.pop("oneOf", None)
    all_of = rest.pop("allOf", None)

    enum = rest.get("enum")
    if isinstance(enum, list) and enum and all(_is_primitive(v) for v in enum):
        strict["enum"] = list(rest.pop("enum"))
    if "const" in rest and _is_primitive(rest["const"]):
        strict["const"] = rest.pop("const")
    has_literals = "enum" in strict or "const" in strict
    if has_literals:
        type_ = None

    if isinstance(any_of, list):
        strict["anyOf"] = [_anthropic(variant) for variant in any_of]
    elif isinstance(one_of, list):
        strict["anyOf"] = [_anthropic(variant) for variant in one_of]
    elif isinstance(all_of, list):
        strict["allOf"] = [_anthropic(variant) for variant in all_of]
    elif not has_literals:
        if type_ is None:
            raise ValueError(
                "Schema must have a 'type', 'anyOf', 'oneOf', or 'allOf' field, "
                "or a 'const' or non-empty 'enum' of strings, numbers, booleans, or null."
            )
        strict["type"] = type_

    description = rest.pop("description", None)
    if description is not None:
        strict["description"] = description
    title = rest.pop("title", None)
    if title is not None:
        strict["title"] = title

    _anthropic_keywords(type_, rest, strict)

    # Keywords the API does not support are appended to the description, so the model may still follow them.
    if rest:
        described = strict.get("description")
        strict["description"] = (
            (described + "\n\n" if described is not None else "")
            + "{"
            + ", ".join(f"{key}: {value}" for key, value in rest.items())
            + "}"
        )
    return strict


def _anthropic_keywords(type_: object, rest: dict[str, Any], strict: dict[str, Any]) -> None:
    """The keywords of an object, string or array schema that the API supports, moved from ``rest``."""
    if type_ == "object":
        strict["properties"] = {key: _anthropic(sub) for key, sub in rest.pop("properties", {}).items()}
        rest.pop("additionalProperties", None)
        strict["additionalProperties"] = False
        required = rest.pop("required", None)
        if required is not None:
            strict["required"] = list(required) if isinstance(required, list) else required
    elif type_ == "string":
        format_ = rest.pop("format", None)
        if format_ and format_ in _ANTHROPIC_STRING_FORMATS:
            strict["format"] = format_
        elif format_:
            rest["format"] = format_  # unsupported: kept for the description below
    elif type_ == "array":
        items = rest.pop("items", None)
        if items is not None:
            strict["items"] = _anthropic(items)
        min_items = rest.pop("minItems", None)
        # The SDK's test, precedence included: ``minItems`` 0 or 1 is kept, any other moves to the description.
        if (min_items is not None and min_items == 0) or min_items == 1:
            strict["minItems"] = min_items
        elif min_items is not None:
            rest["minItems"] = min_items


def _resolve(root: dict[str, Any], ref: str) -> Any:
    if not ref.startswith("#/"):
        raise ValueError(f"Unexpected $ref format {ref!r}; Does not start with #/")
    resolved: Any = root
    for key in ref[2:].split("/"):
        resolved = resolved[key]
        if not isinstance(resolved, dict):
            raise ValueError(f"encountered non-dictionary entry while resolving {ref}")
    return resolved


def _openai(json_schema: Any, root: dict[str, Any]) -> dict[str, Any]:
    """The SDK's in-place rewrite (``json_schema`` is a part of the caller's private copy)."""
    if not isinstance(json_schema, dict):
        raise TypeError(f"Expected {json_schema} to be a dictionary")
    for key in ("$defs", "definitions"):
        defs = json_schema.get(key)
        if isinstance(defs, dict):
            for sub in defs.values():
                _openai(sub, root)

    if json_schema.get("type") == "object" and "additionalProperties" not in json_schema:
        json_schema["additionalProperties"] = False

    properties = json_schema.get("properties")
    if isinstance(properties, dict):
        json_schema["required"] = list(properties.keys())
        json_schema["properties"] = {key: _openai(sub, root) for key, sub in properties.items()}

    items = json_schema.get("items")
    if isinstance(items, dict):
        json_schema["items"] = _openai(items, root)

    any_of = json_schema.get("anyOf")
    if isinstance(any_of, list):
        json_schema["anyOf"] = [_openai(variant, root) for variant in any_of]

    all_of = json_schema.get("allOf")
    if isinstance(all_of, list):
        if len(all_of) == 1:
            json_schema.update(_openai(all_of[0], root))
            json_schema.pop("allOf")
        else:
            json_schema["allOf"] = [_openai(entry, root) for entry in all_of]

    # A ``None`` default says nothing a nullable type does not already say.
    if json_schema.get("default", _MISSING) is None:
        json_schema.pop("default")

    # A ``$ref`` beside other keywords is not accepted: it is inlined (the sibling keywords win).
    ref = json_schema.get("$ref")
    if ref and len(json_schema) > 1:
        if not isinstance(ref, str):
            raise TypeError(f"Received non-string $ref - {ref}")
        resolved = _resolve(root, ref)
        json_schema.update({**resolved, **json_schema})
        json_schema.pop("$ref")
        return _openai(json_schema, root)
    return json_schema
