"""Connections to MCP servers, and what this process remembers about each server between calls.

What it guarantees:

- **Stateless first.** The first connection to a server probes ``server/discover`` (the SDK's ``auto``
  mode). A server that answers with the 2026-07-28 revision is remembered as such, and every later
  connection adopts that discovery result: a call is one plain HTTP request, with no handshake and no
  session. A server that does not is remembered as handshake-era and later connections skip the probe
  and go straight to ``initialize``.
- **The tool list is fetched once per process** (per server configuration), not once per call: each
  new connection is handed the remembered listing, which the SDK needs to check structured results and
  to stamp 2026-07-28 parameter headers; without it the SDK lists the tools again on every call. A
  server's ``notifications/tools/list_changed`` forgets the listing, so the next call lists afresh.
- **Nothing stale survives a failure.** A connection or call that fails forgets what was remembered
  about that server (a server upgraded or moved is probed again on the next call).

The memory is a module-level dictionary keyed by the server's configuration: a warm Lambda keeps it
between invocations, a cold start begins empty. Nothing of a user's is kept in it.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TextIO, cast

from stepagent.tools.mcp_config import McpServer


@dataclass(slots=True)
class ServerFacts:
    """What this process learned about one server: its era (``discover`` is the 2026-07-28 discovery
    result, ``None`` for a handshake-era server) and its tool listing (``None``: not listed yet)."""

    discover: Any | None
    listing: Any | None = None


_FACTS: dict[str, ServerFacts] = {}


def server_key(server: McpServer) -> str:
    """The configuration a server is remembered by (two entries that differ anywhere are two servers)."""
    return server.model_dump_json()


def facts(server: McpServer) -> ServerFacts | None:
    """What is remembered about ``server`` (``None``: nothing yet)."""
    return _FACTS.get(server_key(server))


def forget(server: McpServer) -> None:
    """Forget everything about ``server``: the next connection probes it again."""
    _FACTS.pop(server_key(server), None)


def forget_all() -> None:
    """Forget every server (a fresh cold start; tests use it)."""
    _FACTS.clear()


async def _list_all(client: Any) -> Any:
    """``client``'s server's complete tool listing (every page, as one result)."""
    from mcp_types import ListToolsResult

    listed: list[Any] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        listed.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return ListToolsResult(tools=listed)


@dataclass(slots=True)
class Bearer:
    """A user's access token for one connection (``auth: oauth`` servers), and what the server said of it:
    ``refused`` once it answered 401, with its ``WWW-Authenticate`` header in ``challenge``."""

    token: str | None
    refused: bool = False
    challenge: str | None = None

    async def watch(self, response: Any) -> None:
        """An httpx response hook: remember a 401 (the SDK reports it only as a generic error)."""
        if response.status_code == 401:
            self.refused = True
            self.challenge = response.headers.get("www-authenticate")


@dataclass(slots=True)
class McpConnection:
    """How to reach one server; :meth:`session` opens a connected ``mcp.Client`` (see the module docstring)."""

    server: McpServer
    errlog: TextIO | None = None

    def _transport(self, bearer: Bearer | None = None) -> AbstractAsyncContextManager[Any]:
        server = self.server
        if server.command is not None:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(
                command=server.command, args=list(server.args), env=dict(server.env)
            )
            # A server's stderr is its log; in Lambda it would interleave with ours, so it is kept only on
            # request. The SDK hands ``errlog`` to the subprocess as its stderr, where DEVNULL is valid.
            errlog = self.errlog if self.errlog is not None else cast(TextIO, subprocess.DEVNULL)
            return stdio_client(params, errlog=errlog)
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        headers = dict(server.headers)
        hooks: dict[str, list[Any]] = {}
        if bearer is not None:
            if bearer.token is not None:
                headers["Authorization"] = f"Bearer {bearer.token}"
            hooks["response"] = [bearer.watch]
        client = httpx2.AsyncClient(
            headers=headers, timeout=httpx2.Timeout(30.0, read=300.0), event_hooks=hooks
        )
        return _owning(client, streamable_http_client(str(server.url), http_client=client))

    @asynccontextmanager
    async def session(
        self, *, elicitation_callback: Any = None, bearer: Bearer | None = None
    ) -> AsyncIterator[Any]:
        """A connected client: stateless for a known 2026-07-28 server, a handshake for a known older one,
        the SDK's probe for a server not seen yet. ``elicitation_callback`` answers a handshake-era
        server's questions during a call (and declares the elicitation capability in both eras);
        ``bearer`` sends a user's token and notes a 401."""
        from mcp import Client

        server = self.server
        key = server_key(server)
        known = _FACTS.get(key)
        options: dict[str, Any] = {"cache": None, "message_handler": _list_changed_handler(server)}
        if elicitation_callback is not None:
            options["elicitation_callback"] = elicitation_callback
        if known is None:
            options["mode"] = "auto"
        elif known.discover is None:
            options["mode"] = "legacy"
        else:
            options["mode"] = known.discover.supported_versions[-1]
            options["prior_discover"] = known.discover
        try:
            async with Client(self._transport(bearer), **options) as client:
                session = client.session
                if known is None:
                    known = ServerFacts(discover=session.discover_result)
                    _FACTS[key] = known
                if known.listing is None:
                    known.listing = await _list_all(client)
                else:
                    # The SDK's own Client re-absorbs a cached listing the same way (Client.list_tools).
                    session._absorb_tool_listing(known.listing.model_copy(deep=True), complete=True)
                yield client
        except BaseException:
            _FACTS.pop(key, None)
            raise


def _list_changed_handler(server: McpServer) -> Any:
    """A message handler that forgets ``server``'s listing when it says its tools changed."""

    async def handle(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            known = _FACTS.get(server_key(server))
            if known is not None:
                known.listing = None

    return handle


@asynccontextmanager
async def _owning(http_client: Any, transport: AbstractAsyncContextManager[Any]) -> AsyncIterator[Any]:
    """``transport``, closing the HTTP client it was given afterwards."""
    async with http_client, transport as streams:
        yield streams
