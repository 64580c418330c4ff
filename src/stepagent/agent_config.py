"""Agent configuration: what the agent is — its instructions, output limit, temperature, context window,
compaction threshold, the built-in tools it is offered, and named per-conversation profiles — as one
typed object, :class:`AgentConfig`.

It is the only place these options are named. ``Settings.agent_config()`` builds one from the environment
(:func:`agent_config_from_env`), ``StepConfig(agent=...)`` (step mode, the worker) and
``LocalAgentSystem.create(agent=...)`` (local mode) take one. Each field has one setting (``max_tokens``:
``STEPAGENT_MAX_TOKENS``; the README's Configuration section lists them): its name, what users read when
its value is wrong and how its text is read are declared once, by the
:class:`~stepagent.config_errors.Setting` of the field's type below (:data:`MaxTokens`, ...); the
environment reader, the error lines and :data:`AGENT_SETTING_NAMES` are derived from them.

Guarantees:

- Construction validates every field; all bad values are reported together in one
  :class:`~stepagent.errors.ConfigurationError`, one line each, every line naming its setting.
- ``builtin_tools`` is always a frozenset of built-in tool names after construction (a string is parsed).
- A profile (:class:`AgentProfile`) overrides only what it sets; a root thread selects one through its
  metadata (``{"profile": "<name>"}``, :data:`PROFILE_METADATA_KEY`) and its descendants use the root's.
- ``@path`` files are read once, here, at start (:mod:`stepagent.at_path`: the current directory,
  ``LAMBDA_TASK_ROOT``, then the import roots of the user's tools), a profile's next to the profiles file
  first.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, InstanceOf, PlainValidator, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from stepagent.at_path import read_at_file, search_roots
from stepagent.config_errors import (
    LABELLED,
    WHOLE_LINE,
    ConfigModel,
    Given,
    Setting,
    error_lines,
    labelled,
    parsed_text_or_list,
    settings_of,
)
from stepagent.errors import ConfigurationError
from stepagent.output_schema import OutputSchema, parse_output_schema
from stepagent.providers.base import ModelProvider
from stepagent.tools.builtins import (
    ALL_BUILTINS,
    BUILTIN_GROUPS,
    BUILTIN_TOOL_NAMES,
    BUILTIN_TOOLS_SETTING,
    CHILD_TOOLS,
    parse_builtin_tools,
)

#: The root-thread metadata key that selects a profile: ``{"profile": "support"}``.
PROFILE_METADATA_KEY = "profile"
DEFAULT_COMPACTION_THRESHOLD = 0.75
DEFAULT_MAX_MODEL_CALLS_PER_TURN = 50
DEFAULT_OUTPUT_RETRIES = 2
_PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


# ---- how a setting's text is read -------------------------------------------------------------------------


def _prompt(raw: str, setting: Setting, roots: Sequence[Path]) -> str:
    if not raw.startswith("@"):
        return raw
    text, _ = read_at_file(raw, str(setting.name), roots)
    if not text.strip():
        raise ConfigurationError(f"{setting.name}={raw!r}: the file is empty")
    return text


def _whole(raw: str, setting: Setting, roots: Sequence[Path]) -> int:
    try:
        return int(raw.replace("_", ""))
    except ValueError:
        raise ConfigurationError(f"{setting.name}={raw!r} is invalid: {setting.expected}") from None


def _number(raw: str, setting: Setting, roots: Sequence[Path]) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{setting.name}={raw!r} is invalid: not a number") from None
    if not math.isfinite(value):
        raise ConfigurationError(f"{setting.name}={raw!r} is invalid: not a finite number")
    return value


def _schema(raw: str, setting: Setting, roots: Sequence[Path]) -> OutputSchema:
    text = read_at_file(raw, str(setting.name), roots)[0] if raw.startswith("@") else raw
    return parse_output_schema(text, str(setting.name))


# ---- approval ---------------------------------------------------------------------------------------------

APPROVAL = "STEPAGENT_APPROVAL"


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


# ---- the values, each with its setting ---------------------------------------------------------------------

_TOKENS = "a positive whole number of tokens"
SystemPrompt = Annotated[str, Setting("STEPAGENT_SYSTEM_PROMPT", "text (or @path to a UTF-8 file)", _prompt)]
MaxTokens = Annotated[int, Field(ge=1), Setting("STEPAGENT_MAX_TOKENS", _TOKENS, _whole)]
Temperature = Annotated[
    float,
    Field(ge=0, le=2, allow_inf_nan=False),
    Setting("STEPAGENT_TEMPERATURE", "a number from 0 to 2", _number),
]
ContextWindow = Annotated[int, Field(ge=1), Setting("STEPAGENT_CONTEXT_WINDOW", _TOKENS, _whole)]
CompactionThreshold = Annotated[
    float,
    Field(gt=0, le=1, allow_inf_nan=False),
    Setting(
        "STEPAGENT_COMPACTION_THRESHOLD",
        "a share of the context window, greater than 0 and at most 1 (e.g. 0.75)",
        _number,
    ),
]
BuiltinTools = Annotated[
    frozenset[str], parsed_text_or_list(parse_builtin_tools), Setting(BUILTIN_TOOLS_SETTING)
]
MaxModelCallsPerTurn = Annotated[
    int,
    Field(ge=1),
    Setting("STEPAGENT_MAX_MODEL_CALLS_PER_TURN", "a positive whole number of model calls", _whole),
]
MaxConversationTokens = Annotated[
    int, Field(ge=1), Setting("STEPAGENT_MAX_CONVERSATION_TOKENS", _TOKENS, _whole)
]
MaxConversationCostUsd = Annotated[
    float,
    Field(gt=0, allow_inf_nan=False),
    Setting(
        "STEPAGENT_MAX_CONVERSATION_COST_USD",
        "dollars, a number greater than 0 (e.g. 2.50)",
        lambda raw, setting, roots: _number(raw.removeprefix("$"), setting, roots),
    ),
]


def _output_schema(value: Any) -> Any:
    return None if value is None else labelled(OutputSchema.of, value)


#: A JSON Schema dict, a pydantic model class or an :class:`OutputSchema` (normalised to the latter).
Schema = Annotated[
    InstanceOf[OutputSchema],
    BeforeValidator(_output_schema),
    Setting("STEPAGENT_OUTPUT_SCHEMA", read=_schema),
]
OutputRetries = Annotated[
    int, Field(ge=0), Setting("STEPAGENT_OUTPUT_RETRIES", "a whole number >= 0 (e.g. 2)", _whole)
]
#: Tools whose calls wait for a person's decision (names or patterns; :func:`parse_approval`).
Approval = Annotated[tuple[str, ...], parsed_text_or_list(parse_approval), Setting(APPROVAL)]
PromptCacheTtl = Annotated[
    str,
    Field(pattern="^(5m|1h|auto)$"),
    Setting(
        "STEPAGENT_PROMPT_CACHE_TTL",
        "use 5m, 1h or auto (the default: one hour when the thread waits on something slow, else five minutes)",
        lambda raw, setting, roots: raw.lower(),
    ),
]


def _model_spec(value: Any) -> Any:
    if isinstance(value, str) and ":" not in value:
        raise PydanticCustomError(LABELLED, f" {value!r} is not <provider>:<model id>")
    if value is None or isinstance(value, str) or callable(getattr(value, "stream", None)):
        return value
    raise PydanticCustomError("string_type", "a model spec or provider")


# ---- the typed configuration ------------------------------------------------------------------------------


class AgentProfile(ConfigModel):
    """A named agent a conversation can select through its root's metadata. ``None`` fields inherit
    :class:`AgentConfig`'s value; ``model`` is a ``<provider>:<model id>`` spec (or a provider object,
    in Python); ``tools`` are names or ``fnmatch`` patterns of the deployment's own tools (function, RAP
    and MCP tools; built-ins are chosen by ``builtin_tools``), every one of which must match a tool."""

    name: Annotated[str, Given()]
    system_prompt: SystemPrompt | None = None
    max_tokens: MaxTokens | None = None
    context_window: ContextWindow | None = None
    temperature: Temperature | None = None
    max_model_calls_per_turn: MaxModelCallsPerTurn | None = None
    max_conversation_tokens: MaxConversationTokens | None = None
    max_conversation_cost_usd: MaxConversationCostUsd | None = None
    model: Annotated[str | ModelProvider | None, PlainValidator(_model_spec)] = None
    tools: Annotated[tuple[Annotated[str, Field(min_length=1)], ...], Field(strict=False)] | None = None
    builtin_tools: BuiltinTools | None = None
    output_schema: Schema | None = None
    #: Replaces :attr:`AgentConfig.approval` for this profile's conversations (``None``: inherit it).
    approval: Approval | None = None

    @field_validator("name")
    @classmethod
    def _named(cls, name: str) -> str:
        if not _PROFILE_NAME.match(name):
            raise PydanticCustomError(
                WHOLE_LINE,
                f"{_where()} name {name!r} is invalid (letters, digits, '_', '.', '-'; at most 64 characters)",
            )
        return name

    @classmethod
    def _error_prefix(cls, data: dict[str, Any]) -> str:
        return _where(data.get("name"))


class AgentConfig(ConfigModel):
    """The agent's configuration (see the module docstring for the settings each field corresponds to).
    Fields are declared in the order their problems are reported."""

    system_prompt: SystemPrompt | None = None
    max_tokens: MaxTokens | None = None
    context_window: ContextWindow | None = None
    temperature: Temperature | None = None
    max_model_calls_per_turn: MaxModelCallsPerTurn | None = DEFAULT_MAX_MODEL_CALLS_PER_TURN
    max_conversation_tokens: MaxConversationTokens | None = None
    max_conversation_cost_usd: MaxConversationCostUsd | None = None
    prompt_cache_ttl: PromptCacheTtl = "auto"
    output_retries: OutputRetries = DEFAULT_OUTPUT_RETRIES
    compaction_threshold: CompactionThreshold = DEFAULT_COMPACTION_THRESHOLD
    output_schema: Schema | None = None
    builtin_tools: BuiltinTools = ALL_BUILTINS
    profiles: Annotated[
        dict[str, AgentProfile],
        Setting("STEPAGENT_PROFILES", read=lambda raw, _, roots: load_profiles(raw, roots)),
    ] = {}
    approval: Approval = ()

    @field_validator("profiles", mode="before")
    @classmethod
    def _named_by_their_keys(cls, profiles: Any) -> Any:
        for name, profile in dict(profiles).items():
            if not isinstance(profile, AgentProfile) or profile.name != name:
                raise PydanticCustomError(
                    LABELLED, f": entry {name!r} must be an AgentProfile named {name!r}"
                )
        return dict(profiles)

    def profile(self, name: str | None) -> AgentProfile | None:
        """The profile called ``name`` (``None`` for the default agent). Raises ``KeyError`` if unknown."""
        return None if name is None else self.profiles[name]


#: Each agent field's setting, in the order the fields are declared.
_SETTINGS = settings_of(AgentConfig)
_PROFILES = _SETTINGS["profiles"].name
#: The agent settings, in the order they are documented.
AGENT_SETTING_NAMES = tuple(
    str(_SETTINGS[key].name)
    for key in (
        *("system_prompt", "max_tokens", "temperature", "context_window", "compaction_threshold"),
        *("builtin_tools", "profiles", "max_model_calls_per_turn", "max_conversation_tokens"),
        *("max_conversation_cost_usd", "output_schema", "output_retries", "approval", "prompt_cache_ttl"),
    )
)


def _where(name: object = None) -> str:
    """How a profile's lines start: ``STEPAGENT_PROFILES: profile 'support': `` (no name: the setting)."""
    return f"{_PROFILES}: profile" if name is None else f"{_PROFILES}: profile {name!r}: "


def profile_name(metadata: Any) -> str | None:
    """The profile a root thread's metadata selects (``None``: the default agent). A non-string value
    is returned as its JSON text, so that it is reported as an unknown profile rather than ignored."""
    if not isinstance(metadata, Mapping) or metadata.get(PROFILE_METADATA_KEY) is None:
        return None
    value = metadata[PROFILE_METADATA_KEY]
    return value if isinstance(value, str) else json.dumps(value)


# ---- from the environment ---------------------------------------------------------------------------------


def agent_config_from_env(environ: Mapping[str, str], *, roots: Sequence[Path] | None = None) -> AgentConfig:
    """The :class:`AgentConfig` the agent settings in ``environ`` describe (unset or empty: defaults).
    Every bad value is reported, one line each, in one ``ConfigurationError``: the values that cannot be
    read first, then the ranges of those that could."""
    tools = environ.get("STEPAGENT_TOOLS", "").strip() or None
    search = list(roots) if roots is not None else search_roots(tools, environ)
    problems: list[str] = []
    values: dict[str, Any] = {}
    for key, setting in _SETTINGS.items():
        raw = environ.get(str(setting.name), "").strip()
        if raw:
            try:
                values[key] = setting.read(raw, setting, search) if setting.read else raw
            except ConfigurationError as error:
                problems.append(str(error))
    try:
        config = AgentConfig(**values)
    except ConfigurationError as error:
        problems.append(str(error))
    if problems:
        raise ConfigurationError("\n".join(problems))
    return config


def load_profiles(raw: str, roots: Sequence[Path]) -> dict[str, AgentProfile]:
    """Profiles from ``STEPAGENT_PROFILES``: a JSON object (or ``@path`` to a JSON file) mapping each
    profile name to an object with any of :class:`AgentProfile`'s fields but ``name``; ``system_prompt``
    and ``output_schema`` may be ``@path`` files, looked for next to the profiles file first."""
    text, where = raw, [*roots]
    if raw.startswith("@"):
        text, path = read_at_file(raw, str(_PROFILES), roots)
        where = [path.parent, *roots]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{_PROFILES} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(f"{_PROFILES} must be a JSON object of profile name → settings")
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
    """The profile ``entry`` (its JSON) describes; every problem of the entry is reported together."""
    prefix = _where(name)
    problems: list[str] = []
    if isinstance(entry, dict):
        if "name" in entry:
            problems.append(f"{prefix}unknown key 'name' (a profile is named by its key)")
        entry = {**entry, "name": name}
        for key, read in (("system_prompt", _prompt), ("output_schema", _schema)):
            if isinstance(entry.get(key), str):
                try:
                    entry[key] = read(
                        entry[key], dataclasses.replace(_SETTINGS[key], name=prefix + key), roots
                    )
                except ConfigurationError as error:
                    problems.append(str(error))
                    del entry[key]
    try:
        profile = AgentProfile.model_validate(entry)
    except ValidationError as error:
        problems += error_lines(error, AgentProfile, prefix=prefix)
    if problems:
        raise ConfigurationError("\n".join(problems))
    return profile


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
