"""A tool's question to the user during a call (an MCP elicitation) as the console asks it inline: the form
built from the question's JSON Schema, and the person's typed answer checked against it before it is sent.

Guarantees:

- **One field per property** of the schema, in its order: ``string`` (a text box), ``number`` and
  ``integer`` (a number box), ``boolean`` (yes / no), and ``enum`` (a list of the allowed values, shown by
  their ``enumNames`` / ``oneOf`` titles when the schema gives them). ``title`` labels a field (else its
  name), ``description`` is its hint, ``default`` its starting value; fields the schema lists as
  ``required`` are marked. A property of another type (MCP allows only these) is a text box sent as text.
- **Nothing invalid is sent.** :func:`answer_from_form` turns the submitted strings into the typed
  ``content`` the server asked for, or raises :class:`AnswerInvalid` naming every field that is wrong — a
  required field left empty, a number that is not one, an integer with a fraction, a value outside the
  enum — so the console shows the reason and sends nothing. An empty optional field is left out.
- Form inputs are named ``field.<property>`` (:data:`FIELD_PREFIX`), so a property called ``csrf`` or
  ``thread`` cannot collide with the console's own form fields.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

FIELD_PREFIX = "field."

FieldKind = Literal["string", "number", "integer", "boolean", "enum"]


class AnswerInvalid(ValueError):
    """The typed answer does not fit the question's form; the message names each wrong field."""


@dataclass(frozen=True, slots=True)
class QuestionField:
    """One field of a question's form."""

    name: str
    kind: FieldKind
    label: str
    required: bool
    description: str = ""
    #: The starting value, as the form shows it (a boolean as ``"true"`` / ``"false"``).
    default: str = ""
    #: For ``enum``: ``(value, label)`` of each allowed value.
    options: tuple[tuple[str, str], ...] = ()

    @property
    def input_name(self) -> str:
        return FIELD_PREFIX + self.name


@dataclass(frozen=True, slots=True)
class QuestionForm:
    """The fields of a question's JSON Schema (empty for a form with no properties)."""

    fields: tuple[QuestionField, ...] = field(default_factory=tuple)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _options(spec: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The allowed values of an enum property, with the labels the schema gives them."""
    if isinstance(spec.get("enum"), list):
        values = [_text(v) for v in spec["enum"]]
        names = spec.get("enumNames")
        labels = (
            [_text(n) for n in names] if isinstance(names, list) and len(names) == len(values) else values
        )
        return tuple(zip(values, labels, strict=True))
    choices = spec.get("oneOf") or spec.get("anyOf")
    if isinstance(choices, list) and all(isinstance(c, Mapping) and "const" in c for c in choices):
        return tuple((_text(c["const"]), _text(c.get("title", c["const"]))) for c in choices)
    return ()


def _kind(spec: Mapping[str, Any]) -> FieldKind:
    if _options(spec):
        return "enum"
    kind = spec.get("type")
    if kind in ("number", "integer", "boolean"):
        return kind  # type: ignore[no-any-return]
    return "string"


def question_form(schema: object) -> QuestionForm:
    """The form of a question's ``requested_schema`` (anything that is not an object schema: no fields)."""
    if not isinstance(schema, Mapping):
        return QuestionForm()
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return QuestionForm()
    required = schema.get("required")
    needed = {str(n) for n in required} if isinstance(required, list) else set()
    fields = []
    for name, raw in properties.items():
        spec: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        fields.append(
            QuestionField(
                name=str(name),
                kind=_kind(spec),
                label=_text(spec.get("title")) or str(name),
                required=str(name) in needed,
                description=_text(spec.get("description")),
                default=_text(spec.get("default")),
                options=_options(spec),
            )
        )
    return QuestionForm(tuple(fields))


def _number(text: str, integer: bool) -> int | float:
    """``text`` as a JSON number (``ValueError`` when it is not one, or not whole for an integer)."""
    value = float(text)  # accepts "1e3", "-2.5"; "nan" and "inf" are refused below
    if not math.isfinite(value):
        raise ValueError(text)
    if integer:
        if not value.is_integer():
            raise ValueError(text)
        return int(value)
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def _value(spec: QuestionField, text: str) -> object:
    if spec.kind in ("number", "integer"):
        try:
            return _number(text, spec.kind == "integer")
        except ValueError:
            wanted = "a whole number" if spec.kind == "integer" else "a number"
            raise AnswerInvalid(f"{spec.label}: {text!r} is not {wanted}") from None
    if spec.kind == "boolean":
        lowered = text.lower()
        if lowered not in ("true", "false"):
            raise AnswerInvalid(f"{spec.label}: choose yes or no")
        return lowered == "true"
    if spec.kind == "enum":
        allowed = [value for value, _ in spec.options]
        if text not in allowed:
            raise AnswerInvalid(f"{spec.label}: {text!r} is not one of {', '.join(allowed)}")
        return text
    return text


def answer_from_form(form: QuestionForm, submitted: Mapping[str, str]) -> dict[str, Any]:
    """The ``content`` of an ``accept`` answer from the submitted form fields (see the module docstring)."""
    content: dict[str, Any] = {}
    problems: list[str] = []
    for spec in form.fields:
        raw = submitted.get(spec.input_name, "")
        text = raw if spec.kind == "string" else raw.strip()
        if text.strip() == "":
            if spec.required:
                problems.append(f"{spec.label} is required")
            continue
        try:
            content[spec.name] = _value(spec, text)
        except AnswerInvalid as error:
            problems.append(str(error))
    if problems:
        raise AnswerInvalid("the answer was not sent: " + "; ".join(problems))
    return content


__all__ = [
    "FIELD_PREFIX",
    "AnswerInvalid",
    "QuestionField",
    "QuestionForm",
    "answer_from_form",
    "question_form",
]
