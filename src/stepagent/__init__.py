"""stepagent: a serverless runtime for AI agents that live on a queue.

Public entry points: :func:`tool` (turn a function into a tool), :class:`InputMessage` (the wire
format), :class:`AgentSystem` (step mode), :class:`LocalAgentSystem` (one process).
"""

from stepagent.messages import InputMessage
from stepagent.system.local import LocalAgentSystem
from stepagent.system.step_mode import AgentSystem
from stepagent.tools.functions import tool

__all__ = ["AgentSystem", "InputMessage", "LocalAgentSystem", "tool"]
