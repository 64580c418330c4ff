"""RAP (remote asynchronous protocol) tools: discovery, invocation, and lifecycle notifications.

Discovery (:func:`load_rap_tools`): each server's manifest is read from ``{base}/.well-known/rap-toolset``
(only there), validated (:func:`~stepagent.rap.protocol.parse_manifest`), and cached in the state store
under ``rap-toolset#{base}`` for ``ttl`` seconds. The spec asks for a per-session cache; a worker builds
its toolset once per process for every thread it serves, so the cache is per server with a TTL instead:
a new manifest is picked up within ``ttl`` plus the life of a warm process. Tool names must be unique
across servers and the tools already present (built-ins, ``STEPAGENT_TOOLS``): a clash is a
:class:`~stepagent.errors.ConfigurationError` naming both owners, never a silent shadow.

Invocation (:class:`RapTool`, asynchronous): ``execute`` records which server owns the call (state cache
``rap-owner#{thread}#{call}``), then POSTs the reference's ``RapInvocation`` body with
``callback_url`` = the callback base plus ``?token=`` (an HMAC bound to the thread and call, see
:mod:`stepagent.rap.tokens`). Network errors and 5xx are retried with the same body; then

- 2xx → nothing more: the result arrives through the receiver;
- any other status → the reference's ``Error: RAP tool '{op}' failed: the server at {endpoint} responded
  with HTTP {status}. No result will arrive for this call.`` (dedup id = the tool call id);
- no answer at all → ``Error: RAP tool '{op}' failed: could not reach the server at {endpoint} ({why}).
  No result will arrive for this call.`` The reference returns an error here and lets the step send the
  generic "Tool call failed"; the specific text tells the model what happened.

Lifecycle (:class:`RapNotifier`): ``cancel_tool_call`` POSTs ``{thread_id, tool_call_id}`` to
``/cancel_tool_call`` of the one server that owns the call (calls of other tools notify nobody);
``thread_closed`` POSTs ``{thread_id}`` to ``/close_thread`` of every server, concurrently. Both are best
effort: one attempt, errors logged, never raised.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stepagent.errors import ConfigurationError, ToolError
from stepagent.messages import ToolResult
from stepagent.rap.protocol import RapInvocation, RapManifestError, ToolDef, ToolsetManifest, parse_manifest
from stepagent.rap.tokens import callback_url_for
from stepagent.stores.base import StateStore
from stepagent.tools.base import Tool, ToolContext
from stepagent.tools.rap_http import RapHttp, RapServerConfig, RapTransportError

log = logging.getLogger(__name__)

MANIFEST_PATH = "/.well-known/rap-toolset"
DEFAULT_MANIFEST_TTL = 300.0
#: How long the owner of a call is remembered: longer than any subscription is expected to live.
OWNER_TTL = 180 * 24 * 3600.0


def owner_key(thread_id: str, tool_call_id: str) -> str:
    """The state cache key recording which RAP server owns call ``tool_call_id`` of thread ``thread_id``."""
    return f"rap-owner#{json.dumps([thread_id, tool_call_id], separators=(',', ':'))}"


@dataclass(frozen=True, slots=True)
class CallbackConfig:
    """Where callbacks go: ``base_url`` (``STEPAGENT_CALLBACK_URL``; ``None`` = the context's) and the
    HMAC ``secret`` (``STEPAGENT_CALLBACK_SECRET``; ``None`` = unsigned URLs, for tests only)."""

    base_url: str | None = None
    secret: str | None = None


class RapTool(Tool):
    """One tool of a RAP server's manifest. Asynchronous: the result arrives by callback."""

    wait = "rap"

    def __init__(
        self,
        server: RapServerConfig,
        manifest: ToolsetManifest,
        definition: ToolDef,
        http: RapHttp,
        callbacks: CallbackConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.server = server
        self.toolset_name = manifest.name
        self.endpoint = manifest.endpoint
        self.definition = definition
        self.http = http
        self.callbacks = callbacks
        self.clock = clock
        # Tool declares these as ClassVars; per-instance values shadow them (see FunctionTool).
        setattr(self, "name", definition.name)  # noqa: B010
        setattr(self, "description", definition.description)  # noqa: B010
        setattr(self, "parameters", definition.input_schema)  # noqa: B010

    def __repr__(self) -> str:
        return f"<RapTool {self.name!r} of RAP server {self.server.base_url}>"

    @property
    def origin(self) -> str:
        return f"RAP server {self.server.base_url}"

    def callback_url(self, context: ToolContext) -> str:
        base = self.callbacks.base_url or context.callback_url
        if not base:
            raise ToolError(
                f"RAP tool '{self.name}' cannot be called: no callback URL is configured "
                "(set STEPAGENT_CALLBACK_URL)"
            )
        if self.callbacks.secret is None:
            return base
        return callback_url_for(base, self.callbacks.secret, context.thread_id, context.tool_call_id)

    def invocation(self, arguments: dict[str, Any], context: ToolContext) -> RapInvocation:
        ancestors = list(context.thread_stack[:-1]) or None
        return RapInvocation(
            operation=self.name,
            arguments=arguments,
            id=context.tool_call_id,
            call_id=context.call_id,
            callback_url=self.callback_url(context),
            group_id=context.thread_id,
            user_id=context.user_id,
            thread_ancestors=ancestors,
        )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | None:
        body = self.invocation(arguments, context).body()
        # Recorded before the POST: once the server has the call, a cancellation must find its owner.
        # A store failure propagates (transient): the intent stays open and is re-driven with the same id.
        expires = self.clock() + OWNER_TTL
        await context.access.cache_put(
            owner_key(context.thread_id, context.tool_call_id), self.server.base_url, expires
        )
        try:
            status = await self.http.post(self.server, self.endpoint, body)
        except RapTransportError as exc:
            raise ToolError(
                f"RAP tool '{self.name}' failed: could not reach the server at {self.endpoint} ({exc}). "
                "No result will arrive for this call."
            ) from None
        if not 200 <= status < 300:
            await context.send_result(
                f"Error: RAP tool '{self.name}' failed: the server at {self.endpoint} responded with "
                f"HTTP {status}. No result will arrive for this call."
            )
        return None


# ----------------------------------------------------------------------------------------------------------
# Discovery


async def fetch_manifest(
    server: RapServerConfig,
    http: RapHttp,
    state: StateStore | None,
    *,
    ttl: float = DEFAULT_MANIFEST_TTL,
    clock: Callable[[], float] = time.time,
) -> ToolsetManifest:
    """The server's validated manifest, from the state cache when fresh. Raises ``RapManifestError``."""
    key = f"rap-toolset#{server.base_url}"
    if state is not None:
        try:
            cached = await state.cache_get(key)
        except Exception:  # a cache outage must not stop discovery
            log.warning("could not read the cached manifest of %s", server.base_url, exc_info=True)
            cached = None
        if cached is not None:
            try:
                return parse_manifest(server.base_url, json.loads(cached))
            except (RapManifestError, json.JSONDecodeError):
                log.warning("ignoring an unreadable cached manifest of %s", server.base_url)
    url = server.url(MANIFEST_PATH)
    try:
        status, content = await http.get_json(server, url)
    except RapTransportError as exc:
        raise RapManifestError(f"RAP server {server.base_url}: GET {url} failed: {exc}") from None
    if not 200 <= status < 300:
        raise RapManifestError(f"RAP server {server.base_url}: GET {url} answered HTTP {status}")
    try:
        data = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RapManifestError(f"RAP server {server.base_url}: the manifest is not JSON: {exc}") from None
    manifest = parse_manifest(server.base_url, data)
    if state is not None:
        try:
            await state.cache_put(key, manifest.to_json(), clock() + ttl)
        except Exception:
            log.warning("could not cache the manifest of %s", server.base_url, exc_info=True)
    return manifest


@dataclass(slots=True)
class RapTools:
    """The outcome of discovery: the tools, and one message per server that could not be loaded."""

    tools: list[RapTool] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def load_rap_tools(
    servers: Sequence[RapServerConfig],
    http: RapHttp,
    state: StateStore | None,
    callbacks: CallbackConfig,
    *,
    existing: Iterable[Tool] = (),
    ttl: float = DEFAULT_MANIFEST_TTL,
    clock: Callable[[], float] = time.time,
) -> RapTools:
    """Discover every server's tools (concurrently). An unreachable or invalid server is reported in
    ``errors`` and contributes no tools; a name clash raises ``ConfigurationError``."""
    results = await asyncio.gather(
        *(fetch_manifest(s, http, state, ttl=ttl, clock=clock) for s in servers), return_exceptions=True
    )
    owners: dict[str, str] = {}
    for tool in existing:
        owners[tool.name] = str(getattr(tool, "origin", None) or "a built-in or STEPAGENT_TOOLS tool")
    loaded = RapTools()
    for server, result in zip(servers, results, strict=True):
        if isinstance(result, RapManifestError):
            loaded.errors.append(str(result))
            continue
        if isinstance(result, BaseException):
            raise result
        origin = f"RAP server {server.base_url}"
        for definition in result.tools:
            if definition.name in owners:
                raise ConfigurationError(
                    f"tool name clash: {origin} offers {definition.name!r}, which {owners[definition.name]} "
                    "already provides; tool names must be unique"
                )
            owners[definition.name] = origin
            loaded.tools.append(RapTool(server, result, definition, http, callbacks, clock))
    return loaded


# ----------------------------------------------------------------------------------------------------------
# Lifecycle


class RapNotifier:
    """A :class:`~stepagent.tools.base.LifecycleNotifier` for RAP servers (best effort, never raises)."""

    def __init__(self, servers: Sequence[RapServerConfig], http: RapHttp, state: StateStore) -> None:
        self.servers = list(servers)
        self.http = http
        self.state = state

    async def _post(self, server: RapServerConfig, path: str, payload: dict[str, Any]) -> None:
        url = server.url(path)
        try:
            status = await self.http.post(server, url, payload, retry=False)
        except Exception as exc:
            log.warning("RAP %s to %s failed: %s", path, url, exc)
            return
        if not 200 <= status < 300:
            log.warning("RAP %s to %s answered HTTP %s", path, url, status)

    async def cancel_tool_call(self, thread_id: str, tool_call_id: str) -> None:
        try:
            owner = await self.state.cache_get(owner_key(thread_id, tool_call_id))
        except Exception:
            log.warning("could not look up the RAP server of call %s", tool_call_id, exc_info=True)
            return
        server = next((s for s in self.servers if s.base_url == owner), None)
        if server is None:
            return  # not a RAP call, or its server is no longer configured: nobody to tell
        await self._post(server, "/cancel_tool_call", {"thread_id": thread_id, "tool_call_id": tool_call_id})

    async def thread_closed(self, thread_id: str) -> None:
        await asyncio.gather(
            *(self._post(s, "/close_thread", {"thread_id": thread_id}) for s in self.servers)
        )
