"""MCP server tools through the official ``mcp`` SDK (stdio and streamable HTTP).

``STEPAGENT_MCP_SERVERS`` lists the servers (:class:`~stepagent.tools.mcp_config.McpServer`). At start,
:func:`load_mcp_tools` lists each server's tools and offers them to the model as
``<server name>__<tool name>`` (characters model APIs reject become ``_``; the original name is kept for
the call).

An :class:`McpTool` is asynchronous, like a function tool: ``execute`` hands the call to the context's
function runner (the tool runner Lambda in AWS, :class:`~stepagent.tools.functions.InProcessFunctionRunner`
locally), which calls :meth:`McpTool.invoke`. ``invoke`` raises only
:class:`~stepagent.errors.ToolError` for anything the model should see: an ``isError`` result (with the
server's text), a protocol error, a server that cannot be started or reached, or the timeout.

Connections (:mod:`stepagent.tools.mcp_session`): a server that speaks the 2026-07-28 revision is called
statelessly — one plain request per call, no handshake — and an older one through a fresh session per
call (a frozen Lambda cannot keep a subprocess or an SSE stream healthy, and concurrent calls never share
a session). The tool list is fetched once per process, not once per call.

Questions during a call (elicitation, :mod:`stepagent.tools.mcp_input`): :meth:`McpTool.call` returns a
:class:`~stepagent.tools.mcp_input.PendingInput` when a 2026-07-28 server asks the user something — the
caller keeps it durably and resumes the call later with the answer (a fresh request carrying the
server's ``requestState``); a handshake-era server's question is put to the ``ask`` callback while the
session stays open, and declined when there is none.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

from stepagent.errors import ConfigurationError, ToolError
from stepagent.messages import ToolResult
from stepagent.tools.base import Tool, ToolContext
from stepagent.tools.mcp_config import McpServer
from stepagent.tools.mcp_input import Ask, PendingInput, Resume, elicit_result, pending_input, question_of
from stepagent.tools.mcp_session import Bearer, McpConnection, facts

log = logging.getLogger(__name__)

SEPARATOR = "__"
DEFAULT_TIMEOUT = 60.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 64
#: Rounds a call may be sent again when a 2026-07-28 server answers with state alone (no question).
_STATE_ONLY_ROUNDS = 10


class ServerUnauthorized(ToolError):
    """The server answered 401: the call needs a (new) sign-in. ``challenge`` is its ``WWW-Authenticate``."""

    def __init__(self, message: str, challenge: str | None) -> None:
        super().__init__(message)
        self.challenge = challenge


def tool_name(server: str, tool: str) -> str:
    """The model-facing name ``<server>__<tool>``, with characters model APIs reject replaced by ``_``."""
    return _UNSAFE.sub("_", f"{server}{SEPARATOR}{tool}")


def _first_cause(exc: BaseException) -> BaseException:
    # anyio task groups wrap failures in exception groups: the first real cause.
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    exc = _first_cause(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _result_text(result: Any) -> str:
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and getattr(block.resource, "text", None) is not None:
            parts.append(block.resource.text)
        else:
            parts.append(f"[{kind} content omitted]")
    if not parts and result.structured_content is not None:
        import json

        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


class McpTool(Tool):
    """One tool of an MCP server. Asynchronous: executed by the function runner through :meth:`invoke`."""

    def __init__(
        self,
        connection: McpConnection,
        remote_name: str,
        description: str,
        parameters: dict[str, Any],
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        self.connection = connection
        self.remote_name = remote_name
        self.timeout = timeout
        setattr(self, "name", tool_name(connection.server.name, remote_name))  # noqa: B010
        setattr(self, "description", description)  # noqa: B010
        setattr(self, "parameters", parameters)  # noqa: B010

    def __repr__(self) -> str:
        return f"<McpTool {self.name!r}>"

    @property
    def origin(self) -> str:
        return f"MCP server {self.connection.server.name!r}"

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | None:
        if context.runner is None:
            raise ConfigurationError(
                f"no function runner configured: cannot dispatch MCP tool '{self.name}' (configure the tool runner)"
            )
        await context.runner.submit(self.name, arguments, context)
        return None

    async def invoke(self, arguments: Mapping[str, Any]) -> str:
        """Call the tool; the result's text, or ``ToolError``. A question from the server is declined
        (this entry point has nobody to ask); the tool runner uses :meth:`call`, which relays it."""
        outcome = await self.call(arguments)
        if isinstance(outcome, PendingInput):
            raise ToolError(
                f"MCP tool '{self.remote_name}' of server '{self.connection.server.name}' asks the user "
                f"a question ({outcome.question.message!r}), which this runner cannot relay"
            )
        return outcome

    async def call(
        self,
        arguments: Mapping[str, Any],
        *,
        resume: Resume | None = None,
        ask: Ask | None = None,
        ask_wait: float = 0.0,
        token: str | None = None,
    ) -> str | PendingInput:
        """Call the tool (or resume a call with the user's answer): the result's text, a
        :class:`PendingInput` when a 2026-07-28 server asks the user something, or ``ToolError``.
        ``ask`` answers a handshake-era server's question while the session stays open; ``ask_wait``
        (seconds it may take) is added to the call's timeout. ``token`` is the user's access token (an
        ``auth: oauth`` server); a 401 raises :class:`ServerUnauthorized`."""
        server = self.connection.server.name
        bearer = Bearer(token) if self.connection.server.auth == "oauth" else None
        try:
            if self.timeout is None:
                result = await self._call(dict(arguments), resume, ask, bearer)
            else:
                limit = self.timeout + (ask_wait if ask is not None else 0.0)
                result = await asyncio.wait_for(self._call(dict(arguments), resume, ask, bearer), limit)
        except TimeoutError:
            raise ToolError(
                f"MCP tool '{self.remote_name}' of server '{server}' timed out after {self.timeout:g} s"
            ) from None
        except ToolError:
            raise
        except Exception as exc:  # spawn failures, protocol errors, HTTP errors (often in exception groups)
            if bearer is not None and bearer.refused:
                raise ServerUnauthorized(
                    f"MCP server '{server}' refused the call to '{self.remote_name}': the user must sign in",
                    bearer.challenge,
                ) from None
            raise ToolError(
                f"MCP server '{server}' failed on '{self.remote_name}': {_describe(exc)}"
            ) from None
        if isinstance(result, PendingInput):
            return result
        text = _result_text(result)
        if result.is_error:
            raise ToolError(
                f"MCP tool '{self.remote_name}' of server '{server}' failed: {text or 'no details'}"
            )
        return text

    async def _call(
        self, arguments: dict[str, Any], resume: Resume | None, ask: Ask | None, bearer: Bearer | None
    ) -> Any:
        from mcp.shared.exceptions import MCPError
        from mcp_types import HEADER_MISMATCH

        try:
            return await self._call_once(arguments, resume, ask, bearer)
        except Exception as error:
            cause = _first_cause(error)
            if not (isinstance(cause, MCPError) and cause.code == HEADER_MISMATCH):
                raise
            # A 2026-07-28 server says the remembered listing of this tool is stale: the failed session
            # forgot it (mcp_session); the call is sent once more on a fresh listing.
            return await self._call_once(arguments, resume, ask, bearer)

    async def _call_once(
        self, arguments: dict[str, Any], resume: Resume | None, ask: Ask | None, bearer: Bearer | None
    ) -> Any:
        from mcp_types import ElicitResult, InputRequiredResult

        async def answer(_context: Any, params: Any) -> Any:
            if ask is None:
                return ElicitResult(action="decline")
            return elicit_result(await ask(question_of(params)))

        async with self.connection.session(elicitation_callback=answer, bearer=bearer) as client:
            responses = None if resume is None else {resume.key: elicit_result(resume.answer)}
            state = None if resume is None else resume.request_state
            for _ in range(_STATE_ONLY_ROUNDS):
                result = await client.session.call_tool(
                    self.remote_name,
                    arguments,
                    input_responses=responses,
                    request_state=state,
                    allow_input_required=True,
                )
                if not isinstance(result, InputRequiredResult):
                    return result
                pending = pending_input(result, self.remote_name)
                if pending is not None:
                    return pending
                # Only state, no question: the server wants the same request again shortly.
                responses, state = None, result.request_state
                await asyncio.sleep(0.05)
            raise ToolError(f"MCP tool '{self.remote_name}' kept asking to be called again; gave up")


async def list_server_tools(connection: McpConnection, *, list_timeout: float = 30.0) -> list[McpTool]:
    """The tools of one server (all pages). Raises ``ConfigurationError`` naming the server."""
    name = connection.server.name
    try:
        async with asyncio.timeout(list_timeout), connection.session():
            known = facts(connection.server)
            assert known is not None and known.listing is not None  # a connected session lists once
            listed: list[Any] = list(known.listing.tools)
    except Exception as exc:
        raise ConfigurationError(f"MCP server {name!r}: could not list its tools: {_describe(exc)}") from None
    tools = []
    for remote in listed:
        made = McpTool(
            connection, remote.name, remote.description or remote.name, _schema(remote.input_schema)
        )
        if len(made.name) > _MAX_NAME:
            log.warning(
                "MCP tool %r of %r skipped: %r is over %d characters", remote.name, name, made.name, _MAX_NAME
            )
            continue
        tools.append(made)
    return tools


def _schema(raw: Any) -> dict[str, Any]:
    schema = dict(raw) if isinstance(raw, dict) else {}
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


async def load_mcp_tools(
    servers: Sequence[McpServer], *, existing: Iterable[Tool] = (), errlog: TextIO | None = None
) -> list[McpTool]:
    """Every configured server's tools, listed concurrently. A server that cannot be listed, or a name
    clash (with another server's tool or an ``existing`` one), is a ``ConfigurationError``."""
    connections = [McpConnection(server, errlog) for server in servers]
    listed = await asyncio.gather(*(list_server_tools(c) for c in connections))
    owners = {
        t.name: str(getattr(t, "origin", None) or "a built-in or STEPAGENT_TOOLS tool") for t in existing
    }
    tools: list[McpTool] = []
    for server_tools in listed:
        for tool in server_tools:
            if tool.name in owners:
                raise ConfigurationError(
                    f"tool name clash: {tool.origin} offers {tool.name!r}, which {owners[tool.name]} already provides"
                )
            owners[tool.name] = tool.origin
            tools.append(tool)
    return tools
