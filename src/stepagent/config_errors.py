"""The configuration inputs' shared vocabulary: the base of their pydantic models, the field metadata that
names a value's setting and says what it must be, and the one formatter that turns a ``ValidationError``
into the lines a person reads: one line per bad value, each naming where it is (``STEPAGENT_MAX_TOKENS``,
``STEPAGENT_MCP_SERVERS[0].args[2]``, ``STEPAGENT_PROFILES: profile 'x': tools``) and what is wrong with it,
in plain words rather than pydantic's.

Guarantees: every error pydantic found is reported (none is dropped or merged), in the order pydantic
found them; an unknown key names the keys allowed there when the model is known; a message raised on
purpose by a validator (``PydanticCustomError``) is kept word for word; constructing a
:class:`ConfigModel` with a bad value raises :class:`~stepagent.errors.ConfigurationError` with those lines.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    GetPydanticSchema,
    Strict,
    Tag,
    ValidationError,
)
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticCustomError

from stepagent.errors import ConfigurationError

Location = tuple[int | str, ...]

_ARM = "one-of:"
#: A validator's error of this type continues its value's label: ``<label><message>``
#: (``STEPAGENT_BUILTIN_TOOLS`` + `` has unknown entry 'x'; ...``).
LABELLED = "setting"
#: A validator's error of this type is a whole line, kept as it is.
WHOLE_LINE = "line"


@dataclass(frozen=True, slots=True)
class Setting:
    """Field metadata: the environment variable a value is read from (``None``: it is only a key inside
    a setting's JSON), what it must be in the words users read (a bad value's line is then
    ``<setting>=<value> is invalid: <expected>``; ``None``: the value's validator words its own errors),
    and how the variable's text becomes a value (``read(text, setting, roots)``; ``None``: the text)."""

    name: str | None
    expected: str | None = None
    read: Callable[..., Any] | None = None


class Given:
    """Field metadata: a value the program passes, not a key people write (left out of ``allowed:``)."""


def _text_or_list(value: object) -> str:
    return f"{_ARM}text" if isinstance(value, str) else f"{_ARM}list"


#: A value written as one string or as a list of strings (``"a,b"`` or ``["a", "b"]``; in Python any
#: collection of strings). A bad value gets one line (the list's), not one per union member as a plain
#: ``str | list[str]`` would.
TextOrList = Annotated[
    Annotated[str, Tag(f"{_ARM}text")] | Annotated[tuple[str, ...], Strict(False), Tag(f"{_ARM}list")],
    Discriminator(_text_or_list),
]


def parsed_text_or_list(parse: Callable[..., Any]) -> GetPydanticSchema:
    """Annotation metadata: validate the value as :data:`TextOrList`, then turn it into the field's type with
    ``parse(value, setting="")``, whose ``ConfigurationError`` becomes a :data:`LABELLED` error."""

    def after(value: Any) -> Any:
        return labelled(parse, value)

    return GetPydanticSchema(lambda _source, handler: handler(Annotated[TextOrList, AfterValidator(after)]))


def labelled(parse: Callable[..., Any], value: Any) -> Any:
    """``parse(value, setting="")``, its ``ConfigurationError`` (worded ``<setting><rest>``) raised as a
    :data:`LABELLED` error so the formatter puts the value's label in front of ``<rest>``."""
    try:
        return parse(value, setting="")
    except ConfigurationError as error:
        raise PydanticCustomError(LABELLED, str(error)) from None


class ConfigModel(BaseModel):
    """The base of the configuration models: immutable, strict types, no unknown key, built on first use;
    a bad value passed to the constructor raises ``ConfigurationError`` (one line each)."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid", defer_build=True)
    #: How a missing key of this model is worded (``{key}``); ``None``: ``missing '<key>'``.
    missing_words: ClassVar[str | None] = None
    #: How an unknown key in this model is worded (``{key!r}``, ``{allowed}``); ``None``:
    #: ``unknown key '<key>'; allowed: <keys>``.
    unknown_words: ClassVar[str | None] = None

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as error:
            lines = error_lines(error, type(self), prefix=self._error_prefix(data))
            raise ConfigurationError("\n".join(lines)) from None

    # Only calling the class goes through this wrapper: pydantic validates a nested model without it (as
    # for its own ``__init__``), so a nested model's errors stay in its container's, with their place.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def _error_prefix(cls, data: dict[str, Any]) -> str:
        """What the constructor's error lines start with (a profile names itself)."""
        return ""


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


def error_lines(error: ValidationError, model: Any = None, *, prefix: str = "") -> list[str]:
    """One line per error of ``error``, each starting with ``prefix``. ``model`` (the validated model or
    type) lets an unknown key's line list the keys allowed there, and a value whose field carries a
    :class:`Setting` be named by its setting (by its key when ``prefix`` places it inside a setting)."""
    lines = []
    for detail in error.errors(include_url=False):
        kind = detail["type"]
        if kind == WHOLE_LINE:
            lines.append(detail["msg"])
            continue
        if kind == "default_factory_not_called":
            continue  # a default computed from another value that is wrong: that value has its line
        loc, problem = describe(detail, model)
        # A value of the model itself is named by its setting; inside a setting's JSON, by its key.
        head = _setting_at(model, loc[:1]) if loc and not prefix else None
        label = where((head.name, *loc[1:]) if head is not None and head.name else loc)
        setting = _setting_at(model, loc) if kind not in ("missing", "extra_forbidden") else None
        if kind == LABELLED:
            lines.append(f"{prefix}{label}{detail['msg']}")
        elif setting is not None and setting.expected is not None:
            lines.append(f"{prefix}{label}={detail['input']!r} is invalid: {setting.expected}")
        else:
            place = prefix + label if label else prefix.rstrip(": ")
            lines.append(f"{place}: {problem}" if place else problem)
    return lines


def describe(detail: ErrorDetails, model: Any = None) -> tuple[Location, str]:
    """Where one error is (its location, minus validator names) and what is wrong, in plain words."""
    kind, loc, value = detail["type"], tuple(detail["loc"]), detail.get("input")
    ctx = detail.get("ctx") or {}
    # A tagged-union or function validator adds its own name to the location; people never wrote it.
    loc = tuple(part for part in loc if not (isinstance(part, str) and part.startswith(("function-", _ARM))))
    if kind in ("missing", "extra_forbidden"):
        target = _model_in(_annotation_at(model, loc[:-1]))
        words = getattr(target, "missing_words" if kind == "missing" else "unknown_words", None)
        allowed = _keys_at(model, loc[:-1])
        if words is not None:
            return loc[:-1], words.format(key=loc[-1], allowed=", ".join(allowed))
        if kind == "missing":
            return loc[:-1], f"missing {loc[-1]!r}"
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


def settings_of(model: type[BaseModel]) -> dict[str, Setting]:
    """Each field of ``model`` that carries a :class:`Setting`, in declaration order."""
    found = {key: _setting_of(field) for key, field in model.model_fields.items()}
    return {key: setting for key, setting in found.items() if setting is not None}


def _setting_of(field: FieldInfo) -> Setting | None:
    inner = typing.get_args(field.annotation) if _is_union(field.annotation) else ()
    for item in [*field.metadata, *(m for arg in inner for m in getattr(arg, "__metadata__", ()))]:
        if isinstance(item, Setting):
            return item
    return None


def _setting_at(model: Any, loc: Location) -> Setting | None:
    """The :class:`Setting` of the field at ``loc`` (a key of the model at ``loc[:-1]``), if any."""
    target = _model_in(_annotation_at(model, loc[:-1])) if loc else None
    field = target.model_fields.get(loc[-1]) if target is not None and isinstance(loc[-1], str) else None
    return None if field is None else _setting_of(field)


def _shown(value: object) -> str:
    if isinstance(value, dict | list):
        return json_type(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return repr(value)


def _keys_at(model: Any, loc: Location) -> list[str]:
    """The keys people may write in the model found at ``loc`` inside ``model`` (empty when unknown)."""
    target = _model_in(_annotation_at(model, loc))
    if target is None:
        return []
    return [
        key
        for key, field in target.model_fields.items()
        if not any(isinstance(m, Given) for m in field.metadata)
    ]


def _annotation_at(model: Any, loc: Location) -> Any:
    annotation: Any = model
    for part in loc:
        target = _model_in(annotation)
        if isinstance(part, str) and target is not None and part in target.model_fields:
            annotation = target.model_fields[part].annotation
        elif isinstance(part, int):
            annotation = _item_type(annotation)
        else:
            return None
    return annotation


def _model_in(annotation: Any) -> type[BaseModel] | None:
    annotation = _bare(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation) if _is_union(annotation) else ():
        if (found := _model_in(arg)) is not None:
            return found
    return None


def _item_type(annotation: Any) -> Any:
    annotation = _bare(annotation)
    for candidate in map(_bare, typing.get_args(annotation) if _is_union(annotation) else (annotation,)):
        if typing.get_origin(candidate) in (list, tuple) and typing.get_args(candidate):
            return typing.get_args(candidate)[0]
    return None


def _bare(annotation: Any) -> Any:
    """``annotation`` without its ``Annotated[...]`` metadata."""
    return typing.get_args(annotation)[0] if typing.get_origin(annotation) is Annotated else annotation


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)
