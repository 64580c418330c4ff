"""Stateless first: a 2026-07-28 server is called without a session, an older one through the handshake,
and the tool list is fetched once per process — counted on real loopback servers of each era (the SDK's
streamable-HTTP app; :func:`~tests.mcp.fixtures.eras.recording` counts every request it receives)."""

from __future__ import annotations

import json
from typing import Any

from stepagent.rap.server import serve_in_background
from stepagent.tools.mcp import McpTool, load_mcp_tools
from stepagent.tools.mcp_config import McpServer
from stepagent.tools.mcp_session import facts, forget
from tests.mcp.fixtures.eras import Recorder, build, recording


async def _tools(base: str) -> dict[str, McpTool]:
    return {t.name: t for t in await load_mcp_tools([McpServer(name="web", url=f"{base}/mcp")])}


async def test_a_2026_server_is_called_statelessly_with_one_request_per_call() -> None:
    seen = Recorder()
    async with serve_in_background(recording(build().streamable_http_app(), seen)) as base:
        tools = await _tools(base)
        assert seen.requests == [("POST", "server/discover"), ("POST", "tools/list")]
        seen.requests.clear()
        for n in range(3):
            assert await tools["web__echo"].invoke({"text": str(n)}) == f"echo: {n}"
        # no handshake, no session, no re-probe, no re-listing: one plain request per call
        assert seen.requests == [("POST", "tools/call")] * 3
        remembered = facts(tools["web__echo"].connection.server)
        assert remembered is not None and remembered.discover is not None


async def test_an_older_server_is_called_through_the_handshake_without_probe_or_listing() -> None:
    seen = Recorder()
    app = recording(build().streamable_http_app(), seen, legacy=True)
    async with serve_in_background(app) as base:
        tools = await _tools(base)
        assert (
            seen.rpc("server/discover") == 1 and seen.rpc("initialize") == 1 and seen.rpc("tools/list") == 1
        )
        seen.requests.clear()
        for n in range(3):
            assert await tools["web__echo"].invoke({"text": str(n)}) == f"echo: {n}"
        assert seen.rpc("initialize") == 3 and seen.rpc("tools/call") == 3  # a session per call, as before
        assert (
            seen.rpc("server/discover") == 0 and seen.rpc("tools/list") == 0
        )  # but never probed or re-listed
        remembered = facts(tools["web__echo"].connection.server)
        assert remembered is not None and remembered.discover is None


async def test_a_failure_forgets_the_server_so_the_next_call_probes_again() -> None:
    seen = Recorder()
    async with serve_in_background(recording(build().streamable_http_app(), seen)) as base:
        tools = await _tools(base)
        server = tools["web__echo"].connection.server
        forget(server)  # what a failed call does (a server moved or upgraded is probed afresh)
        seen.requests.clear()
        assert await tools["web__echo"].invoke({"text": "x"}) == "echo: x"
        assert seen.rpc("server/discover") == 1 and seen.rpc("tools/call") == 1
        # the listing was forgotten too: the SDK lists once to check the result, then it is remembered
        seen.requests.clear()
        assert await tools["web__echo"].invoke({"text": "y"}) == "echo: y"
        assert seen.requests[-1] == ("POST", "tools/call") and seen.rpc("server/discover") == 0


async def test_a_server_that_says_its_tools_changed_is_listed_again_once() -> None:
    seen = Recorder()
    app = recording(build().streamable_http_app(), seen, legacy=True)
    async with serve_in_background(app) as base:
        tools = await _tools(base)
        seen.requests.clear()
        assert await tools["web__grow"].invoke({}) == "grown"  # sends notifications/tools/list_changed
        assert seen.rpc("tools/list") == 0
        remembered = facts(tools["web__grow"].connection.server)
        assert remembered is not None and remembered.listing is None  # forgotten on the notification
        assert await tools["web__echo"].invoke({"text": "a"}) == "echo: a"
        assert await tools["web__echo"].invoke({"text": "b"}) == "echo: b"
        assert seen.rpc("tools/list") == 1  # listed again once, then remembered
        assert remembered.listing is not None and "extra" in {t.name for t in remembered.listing.tools}


async def test_a_stale_listing_rejected_by_a_2026_server_is_refreshed_and_the_call_sent_once_more() -> None:
    """The 2026-07-28 server answers ``HEADER_MISMATCH`` (-32020) when the client's listing of a tool is
    stale; the call is sent again on a fresh listing instead of failing."""
    seen = Recorder()
    inner = recording(build().streamable_http_app(), seen)
    refused: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not refused:
            message = await receive()
            body = json.loads(message.get("body") or b"{}")
            if body.get("method") == "tools/call":
                refused.append(body["id"])
                error = {"code": -32020, "message": "the tool's listed schema changed"}
                payload = json.dumps({"jsonrpc": "2.0", "id": body["id"], "error": error}).encode()
                headers = [(b"content-type", b"application/json")]
                await send({"type": "http.response.start", "status": 400, "headers": headers})
                await send({"type": "http.response.body", "body": payload})
                return

            replayed: list[bool] = []

            async def again() -> dict[str, Any]:
                if replayed:
                    return dict(await receive())
                replayed.append(True)
                return dict(message)

            await inner(scope, again, send)
            return
        await inner(scope, receive, send)

    async with serve_in_background(app) as base:
        tools = await _tools(base)
        seen.requests.clear()
        assert await tools["web__echo"].invoke({"text": "x"}) == "echo: x"
        assert refused  # the first attempt was refused
        # the session that failed forgot the server: probed and listed afresh, then called
        assert (
            seen.rpc("server/discover") == 1 and seen.rpc("tools/list") == 1 and seen.rpc("tools/call") == 1
        )
