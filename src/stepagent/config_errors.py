"""Configuration JSON is validated by pydantic models; this module turns a ``ValidationError`` into the
lines a person reads: one line per bad value, each naming where it is (``rules[1].reply[0].text``,
``STEPAGENT_MCP_SERVERS[0].args[2]``) and what is wrong with it, in plain words rather than pydantic's.

Guarantees: every error pydantic found is reported (none is dropped or merged), in the order pydantic
found them; an unknown key names the keys allowed there when the model is known; a message raised on
purpose by a validator (``PydanticCustomError``) is kept word for word.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, Discriminator, Tag, ValidationError
from pydantic_core import ErrorDetails

Location = tuple[int | str, ...]

_ARM = "one-of:"


def _text_or_list(value: object) -> str:
    return f"{_ARM}text" if isinstance(value, str) else f"{_ARM}list"


#: A value written as one string or as a list of strings (``"a,b"`` or ``["a", "b"]``). A bad value gets
#: one line (the list's), not one per union member as a plain ``str | list[str]`` would.
TextOrList = Annotated[
    Annotated[str, Tag(f"{_ARM}text")] | Annotated[list[str], Tag(f"{_ARM}list")],
    Discriminator(_text_or_list),
]


def json_type(value: object) -> str:
    """How a JSON value's type is named in a message: ``an object``, ``a list``, ``a number``, ``null``…"""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int | float):
        return "a number"
    return type(value).__name__


def where(loc: Sequence[int | str]) -> str:
    """``("rules", 0, "when")`` → ``rules[0].when``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def error_lines(
    error: ValidationError, model: type[BaseModel] | None = None, *, prefix: str = ""
) -> list[str]:
    """One line per error of ``error``: ``<prefix><location>: <problem>``. ``model`` (the validated
    model) lets an unknown key's line list the keys allowed at that place."""
    lines = []
    for detail in error.errors(include_url=False):
        loc, problem = describe(detail, model)
        place = prefix + where(loc)
        lines.append(f"{place}: {problem}" if place else problem)
    return lines


def describe(detail: ErrorDetails, model: type[BaseModel] | None = None) -> tuple[Location, str]:
    """Where one error is (its location, minus validator names) and what is wrong, in plain words."""
    kind, loc, value = detail["type"], tuple(detail["loc"]), detail.get("input")
    ctx = detail.get("ctx") or {}
    # A tagged-union or function validator adds its own name to the location; people never wrote it.
    loc = tuple(part for part in loc if not (isinstance(part, str) and part.startswith(("function-", _ARM))))
    if kind == "missing":
        return loc[:-1], f"missing {loc[-1]!r}"
    if kind == "extra_forbidden":
        allowed = _fields_at(model, loc[:-1])
        hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return loc[:-1], f"unknown key {loc[-1]!r}{hint}"
    if kind in ("string_type", "str_type"):
        return loc, f"must be a string, got {json_type(value)}"
    if kind in ("bool_type", "bool_parsing"):
        return loc, f"must be true or false, got {value!r}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return loc, f"must be a whole number, got {_shown(value)}"
    if kind in ("float_type", "float_parsing", "finite_number"):
        return loc, f"must be a number, got {_shown(value)}"
    if kind in ("list_type", "tuple_type"):
        either = "a string or " if detail["loc"] and detail["loc"][-1] == f"{_ARM}list" else ""
        return loc, f"must be {either}a list, got {json_type(value)}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return loc, f"must be a JSON object, got {json_type(value)}"
    if kind in ("too_short", "string_too_short"):
        return loc, "must not be empty"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        bound = {"greater_than_equal": "at least", "greater_than": "greater than"}.get(kind, "at most")
        limit = ctx.get("ge", ctx.get("gt", ctx.get("le", ctx.get("lt"))))
        return loc, f"must be {bound} {limit}, got {_shown(value)}"
    if kind == "literal_error":
        return loc, f"{value!r} is not one of {ctx.get('expected', '')}"
    if kind == "value_error" and "error" in ctx:
        return loc, str(ctx["error"])
    if not kind.endswith(("_type", "_parsing", "_error")) and "msg" in detail:
        return loc, detail["msg"]  # a PydanticCustomError: our own words
    return loc, f"{detail['msg']} (got {_shown(value)})"


def _shown(value: object) -> str:
    if isinstance(value, dict | list):
        return json_type(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return repr(value)


def _fields_at(model: type[BaseModel] | None, loc: Location) -> list[str]:
    """The field names of the model found at ``loc`` inside ``model`` (empty when it cannot be told)."""
    annotation: Any = model
    for part in loc:
        target = _model_in(annotation)
        if isinstance(part, str) and target is not None and part in target.model_fields:
            annotation = target.model_fields[part].annotation
        elif isinstance(part, int):
            annotation = _item_type(annotation)
        else:
            return []
    target = _model_in(annotation)
    return list(target.model_fields) if target is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation) if _is_union(annotation) else ():
        if (found := _model_in(arg)) is not None:
            return found
    return None


def _item_type(annotation: Any) -> Any:
    for candidate in typing.get_args(annotation) if _is_union(annotation) else (annotation,):
        if typing.get_origin(candidate) in (list, tuple) and typing.get_args(candidate):
            return typing.get_args(candidate)[0]
    return None


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)
