"""Which agent a thread runs as — the default agent or a named profile — and what that agent is shown.

Guarantees:

- **One selection rule.** The root thread's metadata key ``"profile"`` names the profile; children read the
  root's metadata, so a whole thread tree runs as the root's profile. No key: the default agent. A name
  the configuration does not define raises :class:`~stepagent.errors.UnknownProfileError` (bad input: the
  worker rejects it with an ``error`` event instead of retrying it forever).
- **Checked at start, failing closed.** :func:`check_agents` (called when a ``StepConfig`` is built) fails
  with one ``ConfigurationError`` line per problem: a profile's model with no provider, a profile's tool
  pattern that matches none of the deployment's tools, an approval entry (``STEPAGENT_APPROVAL`` or a
  profile's ``approval``) that selects no tool — a typo there would otherwise let every call run unasked —
  and a dollar limit on a model whose prices are unknown (it could never be reached).
- **Offered tools.** The built-ins the agent selects (``builtin_tools``), plus ``report_to_parent`` and
  ``close_thread`` in every child thread (a child must be able to report and close), plus the
  deployment's own tools — those matching the profile's ``tools`` patterns, else all. The model is offered
  exactly these, and only these are executed when it calls them; an intent already committed is still
  dispatched from the full toolset.
- **System prompt** (:func:`system_prompt`): the configured prompt (else the built-in intro and "be
  concise"), then the runtime's guidance for the tools actually offered, then the root-thread line. With no
  prompt configured and every built-in offered it is exactly ``texts.DEFAULT_SYSTEM_PROMPT`` + suffix.
- **Limits and output.** The spending limits and the output schema come from the profile where it sets
  them, else the config. Only a root thread has an output schema: children and compaction threads answer
  their parent in free text.
- **Approval.** A call waits for a person's decision when its tool says so (``@tool(approval=True)``) or
  the agent's ``approval`` list (the profile's, else ``STEPAGENT_APPROVAL``) selects it: an own tool by
  name or ``fnmatch`` pattern, a built-in only by its exact name (:meth:`ThreadAgent.needs_approval`).
  Nothing in it names the thread itself, so all threads of a tree that are offered the same tools send
  the same system prompt: a child's or a compaction thread's first request is a prompt-cache hit on the
  parent's prefix (a child learns its id from the tool result that starts it).
- **Model limits.** ``context_window`` (profile, else the config's for the default model) replaces the
  provider's window; ``max_tokens``/``temperature`` travel in every request of the thread.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from stepagent import texts
from stepagent.agent_config import CHILD_TOOLS, AgentConfig, AgentProfile, profile_name
from stepagent.errors import ConfigurationError, UnknownProfileError
from stepagent.output_schema import OutputSchema
from stepagent.providers.base import ModelInfo, ModelProvider
from stepagent.providers.prices import CATALOG_PRICES, PriceTable
from stepagent.providers.window import fixed_part_error
from stepagent.tools.base import Tool, Toolset

_SPAWN = "spawn_thread"


@dataclass(frozen=True, slots=True)
class ThreadAgent:
    """What one thread's completions use."""

    profile: str | None
    provider: ModelProvider
    info: ModelInfo
    toolset: Toolset
    instructions: str | None
    max_tokens: int | None
    temperature: float | None
    compaction_threshold: float
    #: The limits checked before each model call (:mod:`stepagent.core.limits`).
    max_model_calls_per_turn: int | None = None
    max_conversation_tokens: int | None = None
    max_conversation_cost_usd: float | None = None
    #: The schema the root thread's final answers must match (``None``: free text), and the retries.
    output_schema: OutputSchema | None = None
    output_retries: int = 0
    approval: tuple[str, ...] = ()

    def needs_approval(self, tool: Tool) -> bool:
        """Whether a call of ``tool`` waits for a person's decision before it runs."""
        if tool.approval:
            return True
        if tool.builtin:
            return tool.name in self.approval
        return any(fnmatchcase(tool.name, pattern) for pattern in self.approval)

    #: ``STEPAGENT_PROMPT_CACHE_TTL``: ``5m``, ``1h`` or ``auto`` (``core/cache_ttl.py``).
    prompt_cache_ttl: str = "auto"

    @property
    def model(self) -> str:
        """The model's name in usage records and ``turn_complete`` events."""
        return self.info.name


def resolve_agent(
    agent: AgentConfig,
    provider: ModelProvider,
    toolset: Toolset,
    providers: Mapping[str, ModelProvider],
    *,
    metadata: Any,
    child: bool,
) -> ThreadAgent:
    """The agent of a thread whose root has ``metadata``; ``child`` for any thread with a parent."""
    name = profile_name(metadata)
    profile: AgentProfile | None = None
    if name is not None:
        profile = agent.profiles.get(name)
        if profile is None:
            known = ", ".join(sorted(agent.profiles)) or "none are configured"
            raise UnknownProfileError(
                f"the conversation's metadata selects agent profile {name!r}, which is not configured "
                f"(known profiles: {known}; STEPAGENT_PROFILES)"
            )
    chosen = provider
    window = agent.context_window
    if profile is not None and profile.model is not None:
        chosen = _profile_provider(profile, providers)
        window = profile.context_window
    elif profile is not None and profile.context_window is not None:
        window = profile.context_window
    info = chosen.info if window is None else dataclasses.replace(chosen.info, context_window=window)
    builtins = (
        agent.builtin_tools if profile is None or profile.builtin_tools is None else profile.builtin_tools
    )
    patterns = profile.tools if profile is not None else None
    return ThreadAgent(
        profile=name,
        provider=chosen,
        info=info,
        toolset=offered_tools(toolset, builtins, patterns, child=child),
        instructions=_pick(profile and profile.system_prompt, agent.system_prompt),
        max_tokens=_pick(profile and profile.max_tokens, agent.max_tokens),
        temperature=_pick(profile and profile.temperature, agent.temperature),
        compaction_threshold=agent.compaction_threshold,
        max_model_calls_per_turn=_pick(
            profile and profile.max_model_calls_per_turn, agent.max_model_calls_per_turn
        ),
        max_conversation_tokens=_pick(
            profile and profile.max_conversation_tokens, agent.max_conversation_tokens
        ),
        max_conversation_cost_usd=_pick(
            profile and profile.max_conversation_cost_usd, agent.max_conversation_cost_usd
        ),
        output_schema=None if child else _pick(profile and profile.output_schema, agent.output_schema),
        output_retries=agent.output_retries,
        approval=agent.approval if profile is None or profile.approval is None else profile.approval,
        prompt_cache_ttl=agent.prompt_cache_ttl,
    )


def output_limit(agent: ThreadAgent) -> int:
    """The output tokens a request of ``agent`` may ask for: its ``max_tokens``, else the model's maximum."""
    return agent.max_tokens if agent.max_tokens is not None else agent.info.max_output_tokens


def window_problem(agent: ThreadAgent, *, root_thread_id: str = "") -> str | None:
    """Why no request of ``agent`` can fit its model's window — the system prompt, tool schemas and
    output reserve alone exceed it (the message names both sizes and what to change) — or ``None``."""
    system = system_prompt(agent.instructions, agent.toolset, root_thread_id=root_thread_id)
    return fixed_part_error(system, agent.toolset.specs(), agent.info.context_window, output_limit(agent))


def _pick(first: Any, second: Any) -> Any:
    return first if first is not None else second


def _profile_provider(profile: AgentProfile, providers: Mapping[str, ModelProvider]) -> ModelProvider:
    model = profile.model
    if not isinstance(model, str):
        assert model is not None  # the caller checked
        return model
    found = providers.get(model)
    if found is None:
        raise ConfigurationError(
            f"STEPAGENT_PROFILES: profile {profile.name!r} uses model {model!r}, but no provider was built "
            "for it (StepConfig.providers)"
        )
    return found


def offered_tools(
    toolset: Toolset, builtins: frozenset[str], patterns: tuple[str, ...] | None, *, child: bool
) -> Toolset:
    """The tools of ``toolset`` a thread's model is offered (see the module docstring), in toolset order."""
    offered = Toolset()
    for tool in toolset:
        if tool.builtin:
            keep = tool.name in builtins or (child and tool.name in CHILD_TOOLS)
        else:
            keep = patterns is None or any(fnmatchcase(tool.name, pattern) for pattern in patterns)
        if keep:
            offered.tools[tool.name] = tool
    return offered


def system_prompt(instructions: str | None, offered: Toolset, *, root_thread_id: str) -> str:
    """The system prompt of one request (see the module docstring)."""
    guidance = [texts.GUIDE_TOOLS] if len(offered) else []
    if _SPAWN in offered:
        guidance += [texts.GUIDE_SPAWN, texts.GUIDE_CHILD]
    if instructions is None or not instructions.strip():
        head = texts.AGENT_INTRO
        guidance.append(texts.GUIDE_CONCISE)
    else:
        head = instructions.rstrip()
    prompt = head + ("\n\n" + "\n".join(guidance) if guidance else "")
    return prompt + texts.THREAD_SUFFIX.format(root_thread_id=root_thread_id)


def check_agents(
    agent: AgentConfig,
    toolset: Toolset,
    providers: Mapping[str, ModelProvider],
    *,
    default_model: str | None = None,
    prices: PriceTable = CATALOG_PRICES,
) -> None:
    """Fail at start, one line per problem, if a profile cannot be served, an approval entry selects no
    tool, or a dollar limit applies to a model without prices (see the module docstring).
    ``default_model``: the default agent's ``<provider>:<model id>`` (``None``: its limit is not checked)."""
    problems: list[str] = []
    own = [tool.name for tool in toolset if not tool.builtin]
    for name, profile in agent.profiles.items():
        if isinstance(profile.model, str) and profile.model not in providers:
            problems.append(
                f"STEPAGENT_PROFILES: profile {name!r} uses model {profile.model!r}, but no provider was "
                "built for it (StepConfig.providers)"
            )
        for pattern in profile.tools or ():
            if not any(fnmatchcase(tool, pattern) for tool in own):
                known = ", ".join(own) or "none"
                problems.append(
                    f"STEPAGENT_PROFILES: profile {name!r}: tools entry {pattern!r} matches none of the "
                    f"deployment's tools ({known})"
                )
    problems += fail_closed_problems(agent, toolset, default_model, prices)
    if problems:
        raise ConfigurationError("\n".join(problems))


def fail_closed_problems(
    agent: AgentConfig, toolset: Toolset | None, default_model: str | None, prices: PriceTable
) -> list[str]:
    """The settings that would silently do less than they say: approval entries that select no tool of
    ``toolset`` (``None``: the tools are not known yet, not checked) and dollar limits on a model without
    prices (the default agent's ``default_model``, ``None``: not checked, and each profile's)."""
    problems: list[str] = []
    if toolset is not None:
        problems += approval_problems(agent.approval, toolset, setting="STEPAGENT_APPROVAL")
    if default_model is not None:
        problems += unpriced_limit_problems(
            agent.max_conversation_cost_usd, default_model, prices, "STEPAGENT_MAX_CONVERSATION_COST_USD"
        )
    for name, profile in agent.profiles.items():
        if profile.approval is not None and toolset is not None:
            problems += approval_problems(
                profile.approval, toolset, setting=f"STEPAGENT_PROFILES: profile {name!r}: approval"
            )
        model = default_model if profile.model is None else _model_name(profile.model)
        if model is None or (profile.max_conversation_cost_usd is None and profile.model is None):
            continue  # the default agent's own limit and model: checked above
        where = f"STEPAGENT_PROFILES: profile {name!r}: max_conversation_cost_usd"
        if profile.max_conversation_cost_usd is None:
            where = f"STEPAGENT_MAX_CONVERSATION_COST_USD (for profile {name!r}, model {model})"
        limit = _pick(profile.max_conversation_cost_usd, agent.max_conversation_cost_usd)
        problems += unpriced_limit_problems(limit, model, prices, where)
    return problems


def approval_problems(patterns: Sequence[str], toolset: Toolset, *, setting: str) -> list[str]:
    """One line per approval entry that selects no tool of ``toolset`` (an own tool by name or pattern, a
    built-in by its exact name: :meth:`ThreadAgent.needs_approval`), naming the closest tool names."""
    own = [tool.name for tool in toolset if not tool.builtin]
    builtins = [tool.name for tool in toolset if tool.builtin]
    problems = []
    for pattern in patterns:
        if pattern in builtins or any(fnmatchcase(tool, pattern) for tool in own):
            continue
        close = difflib.get_close_matches(pattern, [*own, *builtins], n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        known = ", ".join(own) or "none"
        problems.append(
            f"{setting}: {pattern!r} matches no tool, so it would ask for nothing; {hint}"
            f"(the deployment's tools: {known}; a built-in tool is named exactly)"
        )
    return problems


def unpriced_limit_problems(limit: float | None, model: str, prices: PriceTable, setting: str) -> list[str]:
    """A line when a dollar ``limit`` applies to ``model`` but nobody priced it: the limit could never be
    reached, so the deployment would spend without the bound it asked for."""
    if limit is None or prices.price(model) is not None:
        return []
    return [
        f"{setting}=${limit:g} cannot be enforced: the prices of {model} are unknown; set them with "
        f'STEPAGENT_PRICES (e.g. {{"{model}": {{"input": 3.0, "output": 15.0}}}}, dollars per million '
        "tokens) or use STEPAGENT_MAX_CONVERSATION_TOKENS instead"
    ]


def _model_name(model: str | ModelProvider) -> str:
    return model if isinstance(model, str) else model.info.name
