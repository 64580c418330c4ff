"""How to reach an MCP server: plain configuration data, parsed from ``STEPAGENT_MCP_SERVERS`` by the
settings (:mod:`stepagent.aws.settings`) and consumed by the MCP tools (:mod:`stepagent.tools.mcp`).

It lives below both so the tools never depend on the settings layer. :func:`parse_mcp_servers` checks the
JSON with a pydantic model (strict types, no unknown keys) and reports every bad value at once, one line
each, naming the server's place in the list and the key.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ValidationError

from stepagent.errors import ConfigurationError

SETTING = "STEPAGENT_MCP_SERVERS"


@dataclass(frozen=True, slots=True)
class McpServer:
    """One MCP server: stdio (``command``/``args``/``env``) or streamable HTTP (``url``/``headers``). An HTTP
    server with ``auth="oauth"`` is called with each user's own token (:mod:`stepagent.tools.mcp_oauth`):
    ``client_id`` names a registered client (else dynamic client registration), ``scopes`` are requested."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    auth: Literal["oauth"] | None = None
    client_id: str | None = None
    scopes: tuple[str, ...] = ()


@functools.cache
def _model() -> type[BaseModel]:
    """The list's pydantic model, created on first use: a deployment without MCP servers never builds it."""
    from pydantic import ConfigDict, Field, model_validator
    from pydantic_core import PydanticCustomError

    class _ServerSpec(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)
        name: Annotated[str, Field(min_length=1)]
        command: Annotated[str, Field(min_length=1)] | None = None
        args: list[str] = []
        env: dict[str, str] = {}
        url: Annotated[str, Field(min_length=1)] | None = None
        headers: dict[str, str] = {}
        auth: Literal["oauth"] | None = None
        client_id: Annotated[str, Field(min_length=1)] | None = None
        scopes: list[Annotated[str, Field(min_length=1)]] = []

        @model_validator(mode="after")
        def _one_transport(self) -> _ServerSpec:
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

    class _Servers(BaseModel):
        """The list, wrapped so a problem's location starts with the setting's name."""

        model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)
        STEPAGENT_MCP_SERVERS: list[_ServerSpec]

    return _Servers


def parse_mcp_servers(raw: str | None) -> tuple[McpServer, ...]:
    """The servers ``STEPAGENT_MCP_SERVERS`` lists (a JSON list of server objects; unset: none)."""
    if raw is None:
        return ()
    try:
        data: Any = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{SETTING} is not valid JSON: {exc}") from None
    try:
        specs: list[Any] = getattr(_model().model_validate({SETTING: data}), SETTING)
    except ValidationError as error:
        from stepagent.config_errors import error_lines  # only when something is wrong

        raise ConfigurationError("\n".join(error_lines(error, _model()))) from None
    names = [spec.name for spec in specs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigurationError(f"{SETTING} names more than one server {', '.join(map(repr, twice))}")
    return tuple(
        McpServer(
            name=spec.name,
            command=spec.command,
            args=tuple(spec.args),
            env=spec.env,
            url=spec.url,
            headers=spec.headers,
            auth=spec.auth,
            client_id=spec.client_id,
            scopes=tuple(spec.scopes),
        )
        for spec in specs
    )


__all__ = ["McpServer", "parse_mcp_servers"]
