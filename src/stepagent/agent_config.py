"""Agent configuration: what the agent is — its instructions, output limit, temperature, context window,
compaction threshold, the built-in tools it is offered, and named per-conversation profiles — as one
typed object, :class:`AgentConfig`.

It is the only place these options are named. ``Settings.agent_config()`` builds one from the environment
(:func:`agent_config_from_env`), ``StepConfig(agent=...)`` (step mode, the worker) and
``LocalAgentSystem.create(agent=...)`` (local mode) take one. Each field has one setting:

=========================  ===================================  ===========================================
field                      setting                              value
=========================  ===================================  ===========================================
``system_prompt``          ``STEPAGENT_SYSTEM_PROMPT``          text, or ``@path`` to a UTF-8 file
``max_tokens``             ``STEPAGENT_MAX_TOKENS``             positive integer (default: the model's max)
``temperature``            ``STEPAGENT_TEMPERATURE``            0 to 2 (default: the provider's)
``context_window``         ``STEPAGENT_CONTEXT_WINDOW``         tokens, overrides the model catalog
``compaction_threshold``   ``STEPAGENT_COMPACTION_THRESHOLD``   share of the window, 0 < x <= 1 (0.75)
``builtin_tools``          ``STEPAGENT_BUILTIN_TOOLS``          :func:`parse_builtin_tools` (``all``)
``prompt_cache_ttl``       ``STEPAGENT_PROMPT_CACHE_TTL``       ``5m``, ``1h`` or ``auto`` (``auto``)
``profiles``               ``STEPAGENT_PROFILES``               JSON object, or ``@path`` to a JSON file
``max_model_calls_per_turn``  ``STEPAGENT_MAX_MODEL_CALLS_PER_TURN``  positive integer (50)
``max_conversation_tokens``   ``STEPAGENT_MAX_CONVERSATION_TOKENS``   positive integer (default: none)
``max_conversation_cost_usd`` ``STEPAGENT_MAX_CONVERSATION_COST_USD`` dollars, > 0 (default: none)
``output_schema``          ``STEPAGENT_OUTPUT_SCHEMA``          JSON Schema text, or ``@path`` (in Python:
                                                                a dict or a pydantic model class)
``output_retries``         ``STEPAGENT_OUTPUT_RETRIES``         whole number >= 0 (2)
``approval``               ``STEPAGENT_APPROVAL``               :func:`parse_approval` (none)
=========================  ===================================  ===========================================

Guarantees:

- Construction validates every field; all bad values are reported together in one
  :class:`~stepagent.errors.ConfigurationError`, one line each, every line naming its setting.
- ``builtin_tools`` is always a frozenset of built-in tool names after construction (a string is parsed).
- A profile (:class:`AgentProfile`) overrides only what it sets; a root thread selects one through its
  metadata (``{"profile": "<name>"}``, :data:`PROFILE_METADATA_KEY`) and its descendants use the root's.
- ``@path`` files are read once, here, at start: an absolute path as is, else the first existing
  ``root/path`` among the search roots (:func:`search_roots`: the current directory, ``LAMBDA_TASK_ROOT``,
  then the import roots of the user's tools), so a file shipped inside a tools package is found in a
  deployment. A missing file names every place it was looked for.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ValidationError

from stepagent.errors import ConfigurationError
from stepagent.output_schema import OutputSchema, parse_output_schema
from stepagent.providers.base import ModelProvider
from stepagent.tools.builtins import BUILTIN_GROUPS, BUILTIN_TOOL_NAMES, CHILD_TOOLS

#: The root-thread metadata key that selects a profile: ``{"profile": "support"}``.
PROFILE_METADATA_KEY = "profile"
DEFAULT_COMPACTION_THRESHOLD = 0.75
MAX_TEMPERATURE = 2.0
ALL_BUILTINS: frozenset[str] = frozenset(BUILTIN_TOOL_NAMES)

SYSTEM_PROMPT = "STEPAGENT_SYSTEM_PROMPT"
MAX_TOKENS = "STEPAGENT_MAX_TOKENS"
TEMPERATURE = "STEPAGENT_TEMPERATURE"
CONTEXT_WINDOW = "STEPAGENT_CONTEXT_WINDOW"
COMPACTION_THRESHOLD = "STEPAGENT_COMPACTION_THRESHOLD"
BUILTIN_TOOLS = "STEPAGENT_BUILTIN_TOOLS"
PROFILES = "STEPAGENT_PROFILES"
MAX_MODEL_CALLS_PER_TURN = "STEPAGENT_MAX_MODEL_CALLS_PER_TURN"
MAX_CONVERSATION_TOKENS = "STEPAGENT_MAX_CONVERSATION_TOKENS"
MAX_CONVERSATION_COST_USD = "STEPAGENT_MAX_CONVERSATION_COST_USD"
OUTPUT_SCHEMA = "STEPAGENT_OUTPUT_SCHEMA"
OUTPUT_RETRIES = "STEPAGENT_OUTPUT_RETRIES"
DEFAULT_MAX_MODEL_CALLS_PER_TURN = 50
DEFAULT_OUTPUT_RETRIES = 2
APPROVAL = "STEPAGENT_APPROVAL"
PROMPT_CACHE_TTL = "STEPAGENT_PROMPT_CACHE_TTL"
#: ``STEPAGENT_PROMPT_CACHE_TTL``'s values: a fixed lifetime, or ``auto`` (one hour when the thread is
#: expected to wait on something slow, else five minutes: ``stepagent.core.cache_ttl``).
PROMPT_CACHE_TTLS = ("5m", "1h", "auto")
#: The agent settings, in the order they are documented.
AGENT_SETTING_NAMES = (
    SYSTEM_PROMPT,
    MAX_TOKENS,
    TEMPERATURE,
    CONTEXT_WINDOW,
    COMPACTION_THRESHOLD,
    BUILTIN_TOOLS,
    PROFILES,
    MAX_MODEL_CALLS_PER_TURN,
    MAX_CONVERSATION_TOKENS,
    MAX_CONVERSATION_COST_USD,
    OUTPUT_SCHEMA,
    OUTPUT_RETRIES,
    APPROVAL,
    PROMPT_CACHE_TTL,
)
_PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


# ---- approval -------------------------------------------------------------------------------------------


def parse_approval(spec: str | Iterable[str], *, setting: str = APPROVAL) -> tuple[str, ...]:
    """The tools whose calls wait for a person's decision: a comma-separated list (or an iterable) of tool
    names and ``fnmatch`` patterns (``send_email,crm_*``; ``*`` is every tool of the deployment's own).
    A built-in tool needs approval only when named exactly (a pattern never selects one)."""
    entries = spec.split(",") if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for entry in entries:
        if not isinstance(entry, str):
            raise ConfigurationError(f"{setting}: {entry!r} is not a tool name or pattern")
        name = entry.strip()
        if name and name not in names:
            names.append(name)
    return tuple(names)


# ---- built-in tool selection ------------------------------------------------------------------------------


def parse_builtin_tools(spec: str | Iterable[str], *, setting: str = BUILTIN_TOOLS) -> frozenset[str]:
    """The built-in tools selected by ``spec``: a comma-separated list (or an iterable) of ``all``,
    ``none``, group names (``threads``, ``subscriptions``, ``timers``) and tool names, applied left to
    right; ``-name`` removes a tool or group (a list that starts with a removal starts from ``all``).

    ``all`` · ``none`` · ``threads,timers`` · ``all,-timers`` · ``-send_message_to_child`` ·
    ``spawn_thread,report_to_parent,close_thread``. An empty string is an error; an empty collection
    selects none."""
    tokens = [t.strip().lower() for t in (spec.split(",") if isinstance(spec, str) else spec)]
    tokens = [t for t in tokens if t]
    if not tokens:
        if not isinstance(spec, str):
            return frozenset()  # an empty collection selects none
        raise ConfigurationError(f"{setting} is empty: use 'all', 'none' or a comma-separated list")
    selected: set[str] = set(ALL_BUILTINS) if tokens[0].startswith("-") else set()
    unknown: list[str] = []
    for token in tokens:
        remove = token.startswith("-")
        names = _builtin_names(token.removeprefix("-").strip())
        if names is None:
            unknown.append(token)
        elif remove:
            selected.difference_update(names)
        else:
            selected.update(names)
    if unknown:
        valid = ", ".join(["all", "none", *BUILTIN_GROUPS, *BUILTIN_TOOL_NAMES])
        raise ConfigurationError(
            f"{setting} has unknown {'entry' if len(unknown) == 1 else 'entries'} "
            f"{', '.join(map(repr, unknown))}; valid: {valid} (prefix '-' to remove)"
        )
    return frozenset(selected)


def _builtin_names(token: str) -> Iterable[str] | None:
    if token == "all":
        return BUILTIN_TOOL_NAMES
    if token == "none":
        return ()
    if token in BUILTIN_GROUPS:
        return BUILTIN_GROUPS[token]
    if token in BUILTIN_TOOL_NAMES:
        return (token,)
    return None


# ---- the typed configuration ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentProfile:
    """A named agent a conversation can select through its root's metadata. ``None`` fields inherit
    :class:`AgentConfig`'s value; ``model`` is a ``<provider>:<model id>`` spec (or a provider object,
    in Python); ``tools`` are names or ``fnmatch`` patterns of the deployment's own tools (function, RAP
    and MCP tools; built-ins are chosen by ``builtin_tools``), every one of which must match a tool."""

    name: str
    system_prompt: str | None = None
    model: str | ModelProvider | None = None
    tools: tuple[str, ...] | None = None
    builtin_tools: frozenset[str] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    context_window: int | None = None
    max_model_calls_per_turn: int | None = None
    max_conversation_tokens: int | None = None
    max_conversation_cost_usd: float | None = None
    #: A JSON Schema dict, a pydantic model class or an :class:`OutputSchema` (normalised to the latter).
    output_schema: Any = None
    #: Replaces :attr:`AgentConfig.approval` for this profile's conversations (``None``: inherit it).
    approval: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        where = f"{PROFILES}: profile {self.name!r}"
        problems = _name_problems(self.name)
        if self.model is not None and isinstance(self.model, str) and ":" not in self.model:
            problems.append(f"{where}: model {self.model!r} is not <provider>:<model id>")
        if self.tools is not None:
            if isinstance(self.tools, str) or not all(isinstance(t, str) and t for t in self.tools):
                problems.append(f"{where}: tools must be a list of tool names or patterns")
            else:
                object.__setattr__(self, "tools", tuple(self.tools))
        problems += _check_values(
            {key: getattr(self, key) for key in _PROFILE_VALUES if getattr(self, key) is not None},
            where=f"{where}: ",
        )
        for key, parse in (("builtin_tools", parse_builtin_tools), ("approval", parse_approval)):
            if getattr(self, key) is not None:
                try:
                    object.__setattr__(self, key, parse(getattr(self, key), setting=f"{where}: {key}"))
                except ConfigurationError as error:
                    problems.append(str(error))
        if self.output_schema is not None:
            try:
                object.__setattr__(
                    self,
                    "output_schema",
                    OutputSchema.of(self.output_schema, setting=f"{where}: output_schema"),
                )
            except ConfigurationError as error:
                problems.append(str(error))
        if problems:
            raise ConfigurationError("\n".join(problems))


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """The agent's configuration (see the module docstring for the settings each field corresponds to)."""

    system_prompt: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    context_window: int | None = None
    compaction_threshold: float = DEFAULT_COMPACTION_THRESHOLD
    builtin_tools: frozenset[str] = ALL_BUILTINS
    profiles: Mapping[str, AgentProfile] = field(default_factory=dict)
    max_model_calls_per_turn: int | None = DEFAULT_MAX_MODEL_CALLS_PER_TURN
    max_conversation_tokens: int | None = None
    max_conversation_cost_usd: float | None = None
    #: A JSON Schema dict, a pydantic model class or an :class:`OutputSchema` (normalised to the latter).
    output_schema: Any = None
    output_retries: int = DEFAULT_OUTPUT_RETRIES
    #: Tools whose calls wait for a person's decision (names or patterns; :func:`parse_approval`).
    approval: tuple[str, ...] = ()
    prompt_cache_ttl: str = "auto"

    def __post_init__(self) -> None:
        problems: list[str] = []
        try:
            object.__setattr__(self, "approval", parse_approval(self.approval))
        except ConfigurationError as error:
            problems.append(str(error))
        problems += _check_values({key: getattr(self, key) for key in _DEFAULTS})
        if self.output_schema is not None:
            try:
                object.__setattr__(
                    self, "output_schema", OutputSchema.of(self.output_schema, setting=OUTPUT_SCHEMA)
                )
            except ConfigurationError as error:
                problems.append(str(error))
        try:
            object.__setattr__(self, "builtin_tools", parse_builtin_tools(self.builtin_tools))
        except ConfigurationError as error:
            problems.append(str(error))
        profiles = dict(self.profiles)
        for name, profile in profiles.items():
            if not isinstance(profile, AgentProfile) or profile.name != name:
                problems.append(f"{PROFILES}: entry {name!r} must be an AgentProfile named {name!r}")
        object.__setattr__(self, "profiles", profiles)
        if problems:
            raise ConfigurationError("\n".join(problems))

    def profile(self, name: str | None) -> AgentProfile | None:
        """The profile called ``name`` (``None`` for the default agent). Raises ``KeyError`` if unknown."""
        return None if name is None else self.profiles[name]


def profile_name(metadata: Any) -> str | None:
    """The profile a root thread's metadata selects (``None``: the default agent). A non-string value
    is returned as its JSON text, so that it is reported as an unknown profile rather than ignored."""
    if not isinstance(metadata, Mapping) or metadata.get(PROFILE_METADATA_KEY) is None:
        return None
    value = metadata[PROFILE_METADATA_KEY]
    return value if isinstance(value, str) else json.dumps(value)


class _Models(NamedTuple):
    values: type[BaseModel]
    profile_values: type[BaseModel]


@functools.cache
def _models() -> _Models:
    """The pydantic models checking the agent's values, created on first use: a deployment that sets none
    of these values never pays for building them at cold start."""
    from pydantic import ConfigDict, Field

    class _ProfileValues(BaseModel):
        """The ranges of the values a profile and the agent share, in the order their problems are reported.
        Only checked: the dataclasses keep the values they were given."""

        model_config = ConfigDict(strict=True, extra="forbid", defer_build=True)
        system_prompt: str | None = None
        max_tokens: Annotated[int, Field(ge=1)] | None = None
        context_window: Annotated[int, Field(ge=1)] | None = None
        temperature: Annotated[float, Field(ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)] | None = None
        max_model_calls_per_turn: Annotated[int, Field(ge=1)] | None = None
        max_conversation_tokens: Annotated[int, Field(ge=1)] | None = None
        max_conversation_cost_usd: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None

    class _Values(_ProfileValues):
        """The agent's values: a profile's and the deployment-wide ones."""

        prompt_cache_ttl: Literal["5m", "1h", "auto"] = "auto"
        output_retries: Annotated[int, Field(ge=0)] = DEFAULT_OUTPUT_RETRIES
        compaction_threshold: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = (
            DEFAULT_COMPACTION_THRESHOLD
        )

    return _Models(_Values, _ProfileValues)


@functools.cache
def _profile_spec() -> type[BaseModel]:
    """A profile's JSON shape, created on first use (only deployments with profiles need it)."""
    from pydantic import Field

    from stepagent.config_errors import TextOrList

    shared: Any = _models().profile_values  # Any: mypy cannot take a base class from a value

    class _ProfileSpec(shared):  # type: ignore[misc]
        """A profile's JSON: the shared value ranges plus what only a profile has; no other key."""

        model: str | None = None
        tools: list[Annotated[str, Field(min_length=1)]] | None = None
        builtin_tools: TextOrList | None = None
        output_schema: Any = None  # a schema object, or its text or @path; checked by OutputSchema
        approval: TextOrList | None = None

    return _ProfileSpec


#: Each value's setting and what it must be: a bad value's line is ``<setting>=<value> is invalid: <this>``.
_EXPECTED: dict[str, tuple[str, str]] = {
    "prompt_cache_ttl": (
        PROMPT_CACHE_TTL,
        "use 5m, 1h or auto (the default: one hour when the thread waits on something slow, else five minutes)",
    ),
    "system_prompt": (SYSTEM_PROMPT, "text (or @path to a UTF-8 file)"),
    "max_tokens": (MAX_TOKENS, "a positive whole number of tokens"),
    "context_window": (CONTEXT_WINDOW, "a positive whole number of tokens"),
    "temperature": (TEMPERATURE, "a number from 0 to 2"),
    "max_model_calls_per_turn": (MAX_MODEL_CALLS_PER_TURN, "a positive whole number of model calls"),
    "max_conversation_tokens": (MAX_CONVERSATION_TOKENS, "a positive whole number of tokens"),
    "max_conversation_cost_usd": (MAX_CONVERSATION_COST_USD, "dollars, a number greater than 0 (e.g. 2.50)"),
    "output_retries": (OUTPUT_RETRIES, "a whole number >= 0 (e.g. 2)"),
    "compaction_threshold": (
        COMPACTION_THRESHOLD,
        "a share of the context window, greater than 0 and at most 1 (e.g. 0.75)",
    ),
}
#: The values a profile shares with the agent (the others apply to the whole deployment).
_PROFILE_VALUES = (
    "system_prompt",
    "max_tokens",
    "context_window",
    "temperature",
    "max_model_calls_per_turn",
    "max_conversation_tokens",
    "max_conversation_cost_usd",
)
#: The agent's values and their defaults: default values need no check.
_DEFAULTS: dict[str, Any] = {
    **dict.fromkeys(_PROFILE_VALUES),
    "max_model_calls_per_turn": DEFAULT_MAX_MODEL_CALLS_PER_TURN,
    "prompt_cache_ttl": "auto",
    "output_retries": DEFAULT_OUTPUT_RETRIES,
    "compaction_threshold": DEFAULT_COMPACTION_THRESHOLD,
}


def _check_values(values: Mapping[str, Any], *, where: str = "") -> list[str]:
    """One line per value out of its range; ``where`` prefixes a profile's lines (and names the key
    rather than the setting)."""
    # By identity, not equality: a default needs no check, but True (== 1) or 1.0 must still be looked at.
    values = {key: value for key, value in values.items() if value is not _DEFAULTS[key]}
    if not values:
        return []
    models = _models()
    try:
        (models.profile_values if where else models.values).model_validate(values)
    except ValidationError as error:
        return _value_lines(error, where=where)
    return []


def _value_lines(
    error: ValidationError, *, where: str = "", model: type[BaseModel] | None = None
) -> list[str]:
    from stepagent import config_errors  # only when something is wrong

    lines = []
    for detail in error.errors(include_url=False):
        key = detail["loc"][0] if detail["loc"] else None
        if isinstance(key, str) and key in _EXPECTED and detail["type"] not in ("missing", "extra_forbidden"):
            setting, expected = _EXPECTED[key]
            lines.append(f"{where}{key if where else setting}={detail['input']!r} is invalid: {expected}")
        else:
            loc, problem = config_errors.describe(detail, model)
            place = where + config_errors.where(loc) if loc else where.rstrip(": ")
            lines.append(f"{place}: {problem}")
    return lines


# ---- from the environment ---------------------------------------------------------------------------------


def search_roots(tools: str | None = None, environ: Mapping[str, str] | None = None) -> list[Path]:
    """Where a relative ``@path`` is looked for, in order: the current directory, ``LAMBDA_TASK_ROOT``,
    then for the user's toolset (``STEPAGENT_TOOLS=package.module:name``) the directory holding its
    top-level package (its import root) and the package directory itself. Nothing is imported."""
    env = os.environ if environ is None else environ
    roots = [Path.cwd()]
    if env.get("LAMBDA_TASK_ROOT"):
        roots.append(Path(env["LAMBDA_TASK_ROOT"]))
    if tools:
        top = tools.split(":", 1)[0].split(".", 1)[0].strip()
        spec = None
        if top:
            try:
                spec = importlib.util.find_spec(top)
            except (ImportError, ValueError):
                spec = None
        if spec is not None:
            locations = list(spec.submodule_search_locations or [])
            if spec.origin and not locations:
                locations = [str(Path(spec.origin).parent)]
            for location in locations:
                package = Path(location)
                roots += [package.parent, package] if spec.submodule_search_locations else [package]
    unique: list[Path] = []
    for root in roots:
        if root not in unique:
            unique.append(root)
    return unique


def read_at_file(value: str, setting: str, roots: Sequence[Path]) -> tuple[str, Path]:
    """The text of the file named by ``value`` (``@path``) and where it was found."""
    raw = value[1:].strip()
    if not raw:
        raise ConfigurationError(f"{setting}={value!r} names no file after '@'")
    path = Path(raw).expanduser()
    candidates = [path] if path.is_absolute() else [root / path for root in roots]
    for candidate in candidates:
        if candidate.is_file():
            try:
                return candidate.read_text(encoding="utf-8"), candidate
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigurationError(f"{setting}: cannot read {candidate}: {exc}") from None
    looked = ", ".join(str(c) for c in candidates)
    raise ConfigurationError(f"{setting}={value!r}: no such file (looked for {looked})")


def agent_config_from_env(environ: Mapping[str, str], *, roots: Sequence[Path] | None = None) -> AgentConfig:
    """The :class:`AgentConfig` the agent settings in ``environ`` describe (unset or empty: defaults).
    Every bad value is reported, one line each, in one ``ConfigurationError``."""

    def get(name: str) -> str | None:
        value = environ.get(name, "").strip()
        return value or None

    search = list(roots) if roots is not None else search_roots(get("STEPAGENT_TOOLS"), environ)
    problems: list[str] = []
    values: dict[str, Any] = {}

    def attempt(key: str, parse: Any, raw: str | None) -> None:
        if raw is None:
            return
        try:
            values[key] = parse(raw)
        except ConfigurationError as error:
            problems.append(str(error))

    attempt("system_prompt", lambda raw: _prompt(raw, SYSTEM_PROMPT, search), get(SYSTEM_PROMPT))
    attempt("max_tokens", lambda raw: _integer(raw, MAX_TOKENS), get(MAX_TOKENS))
    attempt("temperature", lambda raw: _float(raw, TEMPERATURE), get(TEMPERATURE))
    attempt("context_window", lambda raw: _integer(raw, CONTEXT_WINDOW), get(CONTEXT_WINDOW))
    attempt("compaction_threshold", lambda raw: _float(raw, COMPACTION_THRESHOLD), get(COMPACTION_THRESHOLD))
    attempt("builtin_tools", parse_builtin_tools, get(BUILTIN_TOOLS))
    attempt("profiles", lambda raw: load_profiles(raw, search), get(PROFILES))
    attempt(
        "max_model_calls_per_turn",
        lambda raw: _integer(raw, MAX_MODEL_CALLS_PER_TURN, "model calls"),
        get(MAX_MODEL_CALLS_PER_TURN),
    )
    attempt(
        "max_conversation_tokens",
        lambda raw: _integer(raw, MAX_CONVERSATION_TOKENS),
        get(MAX_CONVERSATION_TOKENS),
    )
    attempt(
        "max_conversation_cost_usd",
        lambda raw: _float(raw.removeprefix("$"), MAX_CONVERSATION_COST_USD),
        get(MAX_CONVERSATION_COST_USD),
    )
    attempt("output_schema", lambda raw: _schema(raw, OUTPUT_SCHEMA, search), get(OUTPUT_SCHEMA))
    attempt(
        "output_retries",
        lambda raw: _integer(raw, OUTPUT_RETRIES, "retries (0 or more)"),
        get(OUTPUT_RETRIES),
    )
    attempt("approval", parse_approval, get(APPROVAL))
    ttl = get(PROMPT_CACHE_TTL)
    if ttl is not None:
        values["prompt_cache_ttl"] = ttl.lower()  # checked by the constructor, with the others
    try:
        config = AgentConfig(**values)  # range checks of what parsed, so every bad value is reported
    except ConfigurationError as error:
        problems.append(str(error))
    if problems:
        raise ConfigurationError("\n".join(problems))
    return config


def _prompt(raw: str, setting: str, roots: Sequence[Path]) -> str:
    if not raw.startswith("@"):
        return raw
    text, _ = read_at_file(raw, setting, roots)
    if not text.strip():
        raise ConfigurationError(f"{setting}={raw!r}: the file is empty")
    return text


def _integer(raw: str, setting: str, what: str = "tokens") -> int:
    try:
        return int(raw.replace("_", ""))
    except ValueError:
        raise ConfigurationError(f"{setting}={raw!r} is invalid: a positive whole number of {what}") from None


def _schema(raw: str, setting: str, roots: Sequence[Path]) -> OutputSchema:
    text = raw
    if raw.startswith("@"):
        text, _ = read_at_file(raw, setting, roots)
    return parse_output_schema(text, setting)


def _float(raw: str, setting: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{setting}={raw!r} is invalid: not a number") from None
    if not math.isfinite(value):
        raise ConfigurationError(f"{setting}={raw!r} is invalid: not a finite number")
    return value


def load_profiles(raw: str, roots: Sequence[Path]) -> dict[str, AgentProfile]:
    """Profiles from ``STEPAGENT_PROFILES``: a JSON object (or ``@path`` to a JSON file) mapping each
    profile name to an object with any of ``system_prompt`` (text or ``@path``, looked for next to the
    profiles file first), ``model``, ``tools``, ``builtin_tools`` (a string or a list),
    ``max_tokens``, ``temperature``, ``context_window``, ``approval`` (a string or a list)."""
    text, where = raw, [*roots]
    if raw.startswith("@"):
        text, path = read_at_file(raw, PROFILES, roots)
        where = [path.parent, *roots]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{PROFILES} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(f"{PROFILES} must be a JSON object of profile name → settings")
    profiles: dict[str, AgentProfile] = {}
    problems: list[str] = []
    for name, entry in data.items():
        try:
            profiles[name] = _profile(name, entry, where)
        except ConfigurationError as error:
            problems.append(str(error))
    if problems:
        raise ConfigurationError("\n".join(problems))
    return profiles


def _profile(name: str, entry: Any, roots: Sequence[Path]) -> AgentProfile:
    """The profile ``entry`` describes. Its JSON shape is checked first; the values whose shape is right
    are then checked by :class:`AgentProfile` too, so every problem of the entry is reported together."""
    where = f"{PROFILES}: profile {name!r}: "
    problems: list[str] = []
    misshapen: set[object] = set()
    spec = _profile_spec()
    try:
        spec.model_validate(entry)
    except ValidationError as error:
        problems += _value_lines(error, where=where, model=spec)
        misshapen = {detail["loc"][0] for detail in error.errors() if detail["loc"]}
    fields = entry if isinstance(entry, dict) else {}
    values = {key: fields[key] for key in spec.model_fields if key in fields and key not in misshapen}
    for key, read in (("system_prompt", _prompt), ("output_schema", _schema)):
        if isinstance(values.get(key), str):
            try:
                values[key] = read(values[key], f"{where}{key}", roots)
            except ConfigurationError as error:
                problems.append(str(error))
                del values[key]
    try:
        profile = AgentProfile(name=name, **values)
    except ConfigurationError as error:
        problems.append(str(error))
    if problems:
        raise ConfigurationError("\n".join(problems))
    return profile


def _name_problems(name: object) -> list[str]:
    if isinstance(name, str) and _PROFILE_NAME.match(name):
        return []
    return [
        f"{PROFILES}: profile name {name!r} is invalid (letters, digits, '_', '.', '-'; at most 64 characters)"
    ]


__all__ = [
    "AGENT_SETTING_NAMES",
    "ALL_BUILTINS",
    "BUILTIN_GROUPS",
    "BUILTIN_TOOL_NAMES",
    "CHILD_TOOLS",
    "PROFILE_METADATA_KEY",
    "AgentConfig",
    "AgentProfile",
    "agent_config_from_env",
    "load_profiles",
    "parse_approval",
    "parse_builtin_tools",
    "profile_name",
    "read_at_file",
    "search_roots",
]
