"""Building the remote tools (RAP servers, MCP servers) and the lifecycle notifier from
:class:`RemoteSettings`.

:func:`load_remote_tools` is what a runtime calls once at start (the worker, the tool runner, local mode):

- RAP servers need ``STEPAGENT_CALLBACK_URL`` and ``STEPAGENT_CALLBACK_SECRET`` (a
  :class:`~stepagent.errors.ConfigurationError` names whichever is missing). A server that cannot be
  reached or serves an invalid manifest is logged and skipped — its tools are missing until the process
  loads them again — so one broken tool server does not stop every agent.
- MCP servers are listed; one that cannot be listed is a ``ConfigurationError`` (a configuration the
  operator controls, so failing loudly at start is the useful answer).
- Names are unique across everything: a clash names both owners (``existing`` are the tools already
  chosen: built-ins and ``STEPAGENT_TOOLS``).
- The notifier (``None`` without RAP servers) cancels a RAP call on its owning server and tells every
  server when a thread closes.
- Without RAP servers no HTTP client is needed (``http`` may be ``None``) and neither the RAP nor the MCP
  client code is imported: a worker without remote tools does not pay for them at cold start.

The configuration comes in as :class:`RemoteSettings`, which the runtime's settings object
(:class:`stepagent.aws.settings.Settings`) satisfies; this module never reads the environment itself.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from stepagent.errors import ConfigurationError
from stepagent.stores.base import StateStore
from stepagent.tools.base import LifecycleNotifier, Tool
from stepagent.tools.mcp_config import McpServer

if TYPE_CHECKING:
    import httpx

    from stepagent.tools.rap_http import RapHttp

log = logging.getLogger(__name__)


class RemoteSettings(Protocol):
    """The settings the remote tools need (the ``STEPAGENT_*`` names are in the error messages)."""

    @property
    def rap_servers(self) -> Sequence[str]:
        """``STEPAGENT_RAP_SERVERS``: RAP server base URLs."""
        ...

    @property
    def callback_url(self) -> str | None:
        """``STEPAGENT_CALLBACK_URL``: where RAP servers post results."""
        ...

    @property
    def callback_secret(self) -> str | None:
        """``STEPAGENT_CALLBACK_SECRET``: the HMAC key of callback tokens."""
        ...

    @property
    def mcp_servers(self) -> Sequence[McpServer]:
        """``STEPAGENT_MCP_SERVERS``: the MCP servers to list."""
        ...

    @property
    def region(self) -> str | None:
        """``AWS_REGION``: signs requests to RAP servers behind IAM whose URL names no region."""
        ...


@dataclass(slots=True)
class RemoteTools:
    """What :func:`load_remote` found: the RAP and MCP tools, their servers' notifier, and the errors."""

    tools: list[Tool] = field(default_factory=list)
    notifier: LifecycleNotifier | None = None
    #: One message per RAP server that could not be loaded (already logged).
    errors: list[str] = field(default_factory=list)


async def load_remote(
    settings: RemoteSettings,
    state: StateStore | None,
    http: httpx.AsyncClient | None,
    *,
    existing: Iterable[Tool] = (),
    rap_http: RapHttp | None = None,
    manifest_ttl: float | None = None,
    mcp: bool = True,
) -> RemoteTools:
    """RAP and MCP tools plus the notifier (see the module docstring). ``mcp=False`` skips MCP servers;
    ``http`` (or ``rap_http``) is required when RAP servers are configured; ``manifest_ttl`` defaults to
    :data:`stepagent.tools.rap.DEFAULT_MANIFEST_TTL`."""
    existing = list(existing)
    out = RemoteTools()
    if settings.rap_servers:
        missing = [
            name
            for name, value in (
                ("STEPAGENT_CALLBACK_URL", settings.callback_url),
                ("STEPAGENT_CALLBACK_SECRET", settings.callback_secret),
            )
            if not value
        ]
        if missing:
            raise ConfigurationError(
                f"STEPAGENT_RAP_SERVERS is set, so {' and '.join(missing)} must be set too "
                "(callbacks go to the receiver's URL and carry an HMAC token made with the secret)"
            )
        from stepagent.tools.rap import DEFAULT_MANIFEST_TTL, CallbackConfig, RapNotifier, load_rap_tools
        from stepagent.tools.rap_http import RapHttp, RapServerConfig

        servers = [RapServerConfig.parse(s, default_region=settings.region) for s in settings.rap_servers]
        if rap_http is None:
            if http is None:
                raise ValueError("load_remote needs an HTTP client when RAP servers are configured")
            rap_http = RapHttp(http)
        client = rap_http
        callbacks = CallbackConfig(settings.callback_url, settings.callback_secret)
        ttl = DEFAULT_MANIFEST_TTL if manifest_ttl is None else manifest_ttl
        loaded = await load_rap_tools(servers, client, state, callbacks, existing=existing, ttl=ttl)
        for error in loaded.errors:
            log.error("%s; its tools are unavailable", error)
        out.tools.extend(loaded.tools)
        out.errors.extend(loaded.errors)
        if state is not None:
            out.notifier = RapNotifier(servers, client, state)
    if mcp and settings.mcp_servers:
        from stepagent.tools.mcp import load_mcp_tools

        out.tools.extend(await load_mcp_tools(settings.mcp_servers, existing=[*existing, *out.tools]))
    return out


async def load_remote_tools(
    settings: RemoteSettings,
    state: StateStore | None,
    http: httpx.AsyncClient | None,
    *,
    existing: Iterable[Tool] = (),
) -> tuple[list[Tool], LifecycleNotifier | None]:
    """``(tools, notifier)``: the remote tools to add to the toolset, and the notifier for ``StepConfig``."""
    remote = await load_remote(settings, state, http, existing=existing)
    return remote.tools, remote.notifier
