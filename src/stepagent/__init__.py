"""stepagent: a serverless runtime for AI agents that live on a queue.

This module's ``__all__`` is its public API: :func:`tool` (turn a function into a tool),
:class:`InputMessage` (the wire format), :class:`AgentSystem` (step mode), :class:`LocalAgentSystem` (one
process), :class:`AgentConfig` and :class:`AgentProfile` (what the agent is: prompt, limits, tools,
profiles — the ``STEPAGENT_*`` agent settings as one object).

The other public modules, each with an exact ``__all__``:

- :mod:`stepagent.client` — ``Client`` / ``SyncClient``: send, follow replies, answer approvals and choices;
- :mod:`stepagent.testing` — ``run_conversation`` and friends: a whole conversation offline, in one call;
- the tool API: :func:`tool` here, :class:`stepagent.errors.ToolError` (what a tool raises for the model to
  see) and :mod:`stepagent.rap.server` (remote tools over RAP);
- the settings: :class:`stepagent.aws.settings.Settings` (``Settings.from_env()``), read from the
  ``STEPAGENT_*`` environment variables.

Every other module (``stepagent.core``, ``stepagent.stores``, ``stepagent.modes``, ``stepagent.console``,
``stepagent.api``, ``stepagent.devstack``, …) and every name a public module does not export is internal:
it may change in any release. Outside Python, the settings, the wire formats, the HTTP API routes and the
command line are the public contract (the README's "Public API" section lists them).

The names here are imported on first use, so a Lambda handler that imports one submodule does not pay for
the rest (cold starts are billed).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepagent.agent_config import AgentConfig, AgentProfile
    from stepagent.messages import InputMessage
    from stepagent.modes.local import LocalAgentSystem
    from stepagent.modes.step_mode import AgentSystem
    from stepagent.tools.functions import tool

__all__ = ["AgentConfig", "AgentProfile", "AgentSystem", "InputMessage", "LocalAgentSystem", "tool"]

_LOCATIONS = {
    "AgentConfig": "stepagent.agent_config",
    "AgentProfile": "stepagent.agent_config",
    "AgentSystem": "stepagent.modes.step_mode",
    "InputMessage": "stepagent.messages",
    "LocalAgentSystem": "stepagent.modes.local",
    "tool": "stepagent.tools.functions",
}


def __getattr__(name: str) -> Any:
    module = _LOCATIONS.get(name)
    if module is None:
        raise AttributeError(f"module 'stepagent' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
