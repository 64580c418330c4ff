"""A typed Python function described for a model: JSON schema from its signature, argument validation,
result text (pure; no tool, runner or server machinery).

Shared by ``@tool`` (:mod:`stepagent.tools.functions`) and the RAP tool-server SDK
(:mod:`stepagent.rap.server`), so both describe and validate functions exactly alike. Guarantees:

- The JSON schema comes from the signature via pydantic: one property per parameter, ``required`` = the
  parameters without defaults, per-parameter descriptions from the docstring (Google, NumPy, reST or Epydoc style, via
  ``docstring_parser``),
  no ``title`` noise, ``additionalProperties: false``. The description is the docstring's first paragraph.
- A bad definition (``*args``/``**kwargs``, a missing annotation, an invalid name or timeout) fails at
  definition time with a :class:`~stepagent.errors.ConfigurationError`.
- :meth:`TypedFunction.validate` raises only :class:`~stepagent.errors.ToolError`, naming each bad argument.
- :func:`result_text` renders a return value: ``str`` as is, anything else as JSON.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Generic, ParamSpec, TypeVar, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from stepagent.errors import ConfigurationError, ToolError

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_TIMEOUT = 60.0
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what every supported provider accepts as a tool name
# The meta kinds docstring_parser gives parameters (Google's "Args:" and its synonyms, reST's ":param",
# NumPy's "Parameters", Epydoc's "@param"): "Attributes:" and "Raises:" entries are not parameters.
_PARAM_KINDS = frozenset({"param", "parameter", "arg", "argument", "key", "keyword", "other_param"})
# Schema keys whose values are data, not sub-schemas: never strip a "title" inside them.
_VALUE_KEYS = frozenset({"default", "const", "enum", "examples"})
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties"})


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(first paragraph joined into one line, {parameter: description}) from a docstring in any style
    ``docstring_parser`` recognises: Google (``Args:``), NumPy (``Parameters``), reST (``:param x:``) or
    Epydoc (``@param x:``). Wrapped lines are joined; ``*args``/``**kwargs`` are named without stars."""
    if not doc:
        return "", {}
    import docstring_parser  # only tool definitions need it: not loaded by a worker without function tools

    parsed = docstring_parser.parse(inspect.cleandoc(doc))
    summary = parsed.short_description or ""
    if parsed.long_description and not parsed.blank_after_short_description:
        summary = f"{summary} {parsed.long_description.split(chr(10) * 2)[0]}"
    params = {
        param.arg_name.lstrip("*"): _one_line(param.description or "")
        for param in parsed.params
        if param.args[0] in _PARAM_KINDS
    }
    return _one_line(summary), params


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _clean_schema(node: Any) -> Any:
    """Drop pydantic's generated ``title`` strings, leaving data values and property names alone."""
    if isinstance(node, list):
        return [_clean_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _clean_schema(sub) for name, sub in value.items()}
        elif key in _VALUE_KEYS:
            out[key] = value
        else:
            out[key] = _clean_schema(value)
    return out


def _arguments_model(
    func: Callable[..., Any], tool_name: str, descriptions: Mapping[str, str]
) -> tuple[type[BaseModel], list[tuple[str, str]]]:
    """A pydantic model over the parameters, and (field name, parameter name) pairs.

    Fields are named ``arg0, arg1, ...`` with the parameter name as alias, so parameters named like
    ``BaseModel`` attributes (``json``, ``schema``, ``model_config``) cannot clash."""
    try:
        signature = inspect.signature(func)
        hints = get_type_hints(func, include_extras=True)
    except (TypeError, ValueError, NameError) as exc:
        raise ConfigurationError(f"tool {tool_name!r}: cannot read the signature: {exc}") from None
    fields: dict[str, Any] = {}
    names: list[tuple[str, str]] = []
    for index, (pname, param) in enumerate(signature.parameters.items()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ConfigurationError(
                f"tool {tool_name!r}: parameter {pname!r} must be a named parameter (no *args, **kwargs, "
                "or positional-only parameters): the model passes arguments by name"
            )
        if pname not in hints:
            raise ConfigurationError(
                f"tool {tool_name!r}: parameter {pname!r} has no type annotation; the schema needs one"
            )
        default = ... if param.default is param.empty else param.default
        field_name = f"arg{index}"
        fields[field_name] = (hints[pname], Field(default, alias=pname, description=descriptions.get(pname)))
        names.append((field_name, pname))
    try:
        model = create_model(f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    except Exception as exc:  # pydantic raises several types for unsupported annotations
        raise ConfigurationError(f"tool {tool_name!r}: unsupported parameter type: {exc}") from None
    return model, names


def _schema(model: type[BaseModel], tool_name: str) -> dict[str, Any]:
    try:
        raw = _clean_schema(model.model_json_schema(by_alias=True))
    except Exception as exc:  # e.g. a parameter type without a JSON schema
        raise ConfigurationError(f"tool {tool_name!r}: cannot build the JSON schema: {exc}") from None
    schema: dict[str, Any] = {"type": "object", "properties": raw.pop("properties", {})}
    if "required" in raw:
        schema["required"] = raw.pop("required")
    raw.pop("type", None)
    raw.pop("additionalProperties", None)
    schema.update(raw)  # "$defs" for nested models
    schema["additionalProperties"] = False
    return schema


def _describe_errors(error: ValidationError) -> str:
    parts: list[str] = []
    for detail in error.errors():
        loc = ".".join(str(part) for part in detail["loc"])
        if not loc:
            parts.append(f"arguments: {detail['msg']}")
        elif detail["type"] == "missing":
            parts.append(f"missing required argument '{loc}'")
        elif detail["type"] == "extra_forbidden":
            parts.append(f"unexpected argument '{loc}'")
        else:
            parts.append(f"argument '{loc}': {detail['msg']}")
    return "; ".join(parts)


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    return str(value)


def result_text(value: Any) -> str:
    """A function's return value as tool-result text: ``str`` as is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=_json_default)


class TypedFunction(Generic[P, R]):
    """A function with its model-facing name, description, JSON schema and timeout. Calling the object calls
    the function unchanged."""

    # Copied from the function by functools.update_wrapper; declared so type checkers know them.
    __name__: str
    __wrapped__: Callable[P, R]

    def __init__(
        self,
        func: Callable[P, R],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        if isinstance(func, TypedFunction) or not callable(func):
            raise ConfigurationError(f"@tool needs a plain or async function, got {func!r}")
        tool_name = name if name is not None else getattr(func, "__name__", "")
        if not _NAME.match(tool_name):
            raise ConfigurationError(
                f"tool name {tool_name!r} is invalid: use 1-64 letters, digits, '_' or '-'"
            )
        if timeout is not None and timeout <= 0:
            raise ConfigurationError(f"tool {tool_name!r}: timeout must be positive, got {timeout!r}")
        summary, arg_docs = parse_docstring(inspect.getdoc(func))
        model, fields = _arguments_model(func, tool_name, arg_docs)
        self._func = func
        self._model = model
        self._fields = fields
        functools.update_wrapper(self, func)
        self.name = tool_name
        self.description = description if description is not None else summary
        self.parameters = _schema(model, tool_name)
        self.timeout = timeout

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<TypedFunction {self.name!r}>"

    @property
    def function(self) -> Callable[P, R]:
        return self._func

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Validated keyword arguments for the function; ``ToolError`` naming each bad argument."""
        try:
            parsed = self._model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolError(f"invalid arguments for tool '{self.name}': {_describe_errors(exc)}") from None
        return {pname: getattr(parsed, field) for field, pname in self._fields}
