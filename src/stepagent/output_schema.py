"""Structured output: the JSON Schema a root thread's final answer must match, and its validation.

``OutputSchema.of({"type": "object", ...})`` or ``OutputSchema.of(MyPydanticModel)``; ``check(text)``
returns the validated JSON value or the list of problems, written for the model to fix them.

Guarantees:

- A schema is checked when it is configured (``jsonschema``'s meta-schema check for its declared draft,
  2020-12 when it declares none), so a broken schema fails at start with :class:`ConfigurationError`, never
  at the first answer.
- A pydantic model class is validated by pydantic itself (its own rules, e.g. field validators); its JSON
  Schema is the class's ``model_json_schema()``, which providers with native structured output send in the
  strict form their vendor's SDK sends for the class (see ``class_name``). A dict schema is sent exactly as
  given: it is the user's to make acceptable to the vendor. Either way this module, not the vendor, decides
  whether an answer is valid. The value returned is the JSON form of the validated model
  (``model_dump(mode="json")``).
- ``jsonschema`` is imported only when a dict schema is configured, so a deployment without one pays
  nothing for it at cold start.
- ``check`` accepts the answer with surrounding whitespace or inside one Markdown code fence (models add
  them); anything else that is not one JSON document is an error. Errors are sorted by their location
  and capped, so feedback is deterministic and bounded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from stepagent.errors import ConfigurationError

MAX_REPORTED_ERRORS = 10
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n(.*)\n```$", re.DOTALL)
_NAME = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True, slots=True)
class OutputCheck:
    """The outcome of checking one answer: ``value`` when it is valid, else ``errors`` (never both)."""

    value: Any = None
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True, slots=True, eq=False)
class OutputSchema:
    """A JSON Schema (from a dict, or a pydantic model class) and how to validate answers against it."""

    schema: dict[str, Any]
    model: type[BaseModel] | None = None

    @property
    def class_name(self) -> str | None:
        """The pydantic model class's name when the schema was generated from one, else ``None``."""
        return self.model.__name__ if self.model is not None else None

    @classmethod
    def of(cls, spec: Any, *, setting: str = "output_schema") -> OutputSchema:
        """An :class:`OutputSchema` from a JSON Schema mapping, a pydantic model class, or an existing one."""
        if isinstance(spec, OutputSchema):
            return spec
        if isinstance(spec, type) and issubclass(spec, BaseModel):
            return cls(spec.model_json_schema(), spec)
        if isinstance(spec, Mapping):
            # Imported here: a deployment without an output schema never loads jsonschema (cold start).
            import jsonschema

            schema = json.loads(json.dumps(spec))  # a plain, JSON-serialisable copy
            validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            try:
                validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                where = "/".join(str(p) for p in exc.path) or "(root)"
                raise ConfigurationError(
                    f"{setting} is not a valid JSON Schema at {where}: {exc.message}"
                ) from None
            return cls(schema)
        raise ConfigurationError(
            f"{setting} must be a JSON Schema (a JSON object) or a pydantic model class, not {type(spec).__name__}"
        )

    def check(self, text: str) -> OutputCheck:
        """Validate ``text`` (the model's final answer) against the schema."""
        body = text.strip()
        fenced = _FENCE.match(body)
        if fenced is not None:
            body = fenced.group(1).strip()
        try:
            value = json.loads(body)
        except json.JSONDecodeError as exc:
            return OutputCheck(
                errors=[f"the answer is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"]
            )
        if self.model is not None:
            try:
                return OutputCheck(value=self.model.model_validate(value).model_dump(mode="json"))
            except ValidationError as exc:
                errors = [
                    f"at {'/'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()
                ]
                return OutputCheck(errors=errors[:MAX_REPORTED_ERRORS])
        import jsonschema

        validator_class = jsonschema.validators.validator_for(
            self.schema, default=jsonschema.Draft202012Validator
        )
        found = sorted(
            validator_class(self.schema).iter_errors(value),
            key=lambda e: ([str(p) for p in e.path], e.message),
        )
        if not found:
            return OutputCheck(value=value)
        return OutputCheck(
            errors=[
                f"at {'/'.join(str(p) for p in e.path) or '(root)'}: {e.message}"
                for e in found[:MAX_REPORTED_ERRORS]
            ]
        )


def schema_name(schema: Mapping[str, Any]) -> str:
    """A name for ``schema`` where an API wants one (OpenAI's ``json_schema.name``: letters, digits, ``_``
    and ``-``, at most 64): its ``title``, else ``output``."""
    title = schema.get("title")
    cleaned = _NAME.sub("_", title)[:64] if isinstance(title, str) and title.strip() else ""
    return cleaned or "output"


def parse_output_schema(raw: str, setting: str) -> OutputSchema:
    """The schema of ``STEPAGENT_OUTPUT_SCHEMA`` text (the ``@path`` case is read by the caller)."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{setting} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(f'{setting} must be a JSON Schema object (e.g. {{"type": "object"}})')
    return OutputSchema.of(data, setting=setting)


def schema_instruction(schema: Mapping[str, Any]) -> str:
    """The instruction a model without a native structured-output mechanism is given."""
    return (
        "When you give your final answer, answer with only a JSON value (no prose, no code fence) that "
        f"matches this JSON Schema:\n{json.dumps(schema, ensure_ascii=False, sort_keys=True)}"
    )


#: In the row id of the feedback on an answer that did not match the schema (``<input id>-output-check-<n>``):
#: how readers tell that user row from one a person wrote.
OUTPUT_CHECK_ID = "-output-check-"


def output_feedback(errors: list[str]) -> str:
    """What the model is told when its answer did not match the schema."""
    listed = "\n".join(f"- {e}" for e in errors)
    return (
        "Your answer does not match the required output schema:\n"
        f"{listed}\n"
        "Answer again with only a JSON value that matches the schema, and nothing else."
    )
