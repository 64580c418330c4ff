"""How to reach an MCP server: plain configuration data, parsed from ``STEPAGENT_MCP_SERVERS`` by the
settings (:mod:`stepagent.aws.settings`) and consumed by the MCP tools (:mod:`stepagent.tools.mcp`).

It lives below both so the tools never depend on the settings layer. :class:`McpServer` is the one model
of a server: :func:`parse_mcp_servers` validates the JSON list with it (strict types, no unknown keys)
and reports every bad value at once, one line each, naming the server's place in the list and the key.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import Field, Strict, TypeAdapter, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from stepagent.config_errors import ConfigModel, error_lines
from stepagent.errors import ConfigurationError

SETTING = "STEPAGENT_MCP_SERVERS"

_Text = Annotated[str, Field(min_length=1)]


class McpServer(ConfigModel):
    """One MCP server: stdio (``command``/``args``/``env``) or streamable HTTP (``url``/``headers``). An HTTP
    server with ``auth="oauth"`` is called with each user's own token (:mod:`stepagent.tools.mcp_oauth`):
    ``client_id`` names a registered client (else dynamic client registration), ``scopes`` are requested."""

    name: _Text
    command: _Text | None = None
    args: Annotated[tuple[str, ...], Strict(False)] = ()  # a JSON list, or any sequence in Python
    env: dict[str, str] = {}
    url: _Text | None = None
    headers: dict[str, str] = {}
    auth: Literal["oauth"] | None = None
    client_id: _Text | None = None
    scopes: Annotated[tuple[_Text, ...], Strict(False)] = ()

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise PydanticCustomError(
                "config", "needs exactly one of 'command' (stdio) or 'url' (streamable HTTP)"
            )
        if self.auth is None and (self.client_id is not None or self.scopes):
            raise PydanticCustomError("config", "'client_id' and 'scopes' need \"auth\": \"oauth\"")
        if self.auth == "oauth" and self.url is None:
            raise PydanticCustomError(
                "config", '"auth": "oauth" needs an HTTP server (\'url\'); a stdio server has no sign-in'
            )
        if self.auth == "oauth" and any(key.lower() == "authorization" for key in self.headers):
            raise PydanticCustomError(
                "config",
                '"auth": "oauth" sends each user\'s own token: remove the \'Authorization\' header',
            )
        return self


#: The setting's JSON: a list of servers.
_Servers = Annotated[tuple[McpServer, ...], Strict(False)]


def needs_oauth(servers: Iterable[McpServer]) -> bool:
    """Whether any of ``servers`` signs its users in (``"auth": "oauth"``)."""
    return any(server.auth == "oauth" for server in servers)


def parse_mcp_servers(raw: str | None) -> tuple[McpServer, ...]:
    """The servers ``STEPAGENT_MCP_SERVERS`` lists (a JSON list of server objects; unset: none)."""
    if raw is None:
        return ()
    try:
        data: Any = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{SETTING} is not valid JSON: {exc}") from None
    try:
        servers = TypeAdapter(_Servers).validate_python(data)
    except ValidationError as error:
        raise ConfigurationError("\n".join(error_lines(error, _Servers, prefix=SETTING))) from None
    names = [server.name for server in servers]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigurationError(f"{SETTING} names more than one server {', '.join(map(repr, twice))}")
    return servers


__all__ = ["McpServer", "needs_oauth", "parse_mcp_servers"]
