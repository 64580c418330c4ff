"""stepagent: a serverless runtime for AI agents that live on a queue.

Public entry points: :func:`tool` (turn a function into a tool), :class:`InputMessage` (the wire
format), :class:`AgentSystem` (step mode), :class:`LocalAgentSystem` (one process), :class:`AgentConfig`
and :class:`AgentProfile` (what the agent is: prompt, limits, tools, profiles — the ``STEPAGENT_*`` agent
settings as one object).

They are imported on first use, so a Lambda handler that imports one submodule does not pay for the rest
(cold starts are billed).
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
