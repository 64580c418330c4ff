"""How to reach an MCP server: plain configuration data, parsed from ``STEPAGENT_MCP_SERVERS`` by the
settings (:mod:`stepagent.aws.settings`) and consumed by the MCP tools (:mod:`stepagent.tools.mcp`).

It lives below both so the tools never depend on the settings layer; it has no behaviour and no imports
beyond the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class McpServer:
    """One MCP server: stdio (``command``/``args``/``env``) or streamable HTTP (``url``/``headers``)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
