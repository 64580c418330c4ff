"""Per-user OAuth in the engine with the in-process function runner (local mode's shape): the sign-in is a
durable wait the API's callback ends (here :func:`complete_sign_in` called as the callback calls it, with
the local AES-GCM key), a completion for a call that does not wait is refused, and a runner without
sign-in support tells the model so instead of calling the server without the user's token."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from stepagent.events import InputRejected, OAuthRequiredEvent
from stepagent.history_items import ToolResultItem
from stepagent.messages import InputMessage, OAuthComplete
from stepagent.providers.base import ModelRequest, StreamEvent
from stepagent.tools.functions import InProcessFunctionRunner
from stepagent.tools.mcp import load_mcp_tools
from stepagent.tools.mcp_config import McpServer
from stepagent.tools.mcp_oauth import CALLBACK_PATH, OAuthServices, complete_sign_in
from stepagent.tools.token_cipher import LocalCipher
from tests.engine.harness import Harness
from tests.mcp.fixtures.oauth import oauth_server
from tests.rap.stack import FunctionModel, call, last_input, say


def model(request: ModelRequest) -> list[StreamEvent]:
    text = last_input(request.history)
    if text == "my notes":
        return call("notes__my_notes", "call-notes")
    return say(f"model saw: {text}")


def _results(history: list[object]) -> list[str | None]:
    return [i.result.first_text() for i in history if isinstance(i, ToolResultItem)]


async def test_a_local_sign_in_resumes_the_call_with_the_users_notes(tmp_path: Path) -> None:
    async with oauth_server() as (base, authority):
        tools = await load_mcp_tools([McpServer(name="notes", url=f"{base}/mcp", auth="oauth")])
        h = Harness(FunctionModel(model), tools)
        runner = InProcessFunctionRunner(tools)
        services = OAuthServices(
            store=h.state,
            cipher=LocalCipher.from_dir(tmp_path),
            redirect_uri="http://app.test" + CALLBACK_PATH,
        )
        runner.oauth = services
        h.config.runner = runner
        await h.send(InputMessage.user_text("t", "my notes", metadata={"user_id": "alice"}), "m1")
        await h.run()
        [asked] = [e for _, e in h.observer.events if isinstance(e, OAuthRequiredEvent)]
        assert asked.tool_call_id == "call-notes"
        assert _results(await h.history("t")) == []  # the call waits

        async with httpx.AsyncClient() as browser:  # the authorization server redirects to the callback
            redirect = await browser.get(asked.auth_url)
        assert redirect.status_code == 302
        back = urlparse(redirect.headers["location"])
        assert back.path == CALLBACK_PATH
        query = {k: v[0] for k, v in parse_qs(back.query).items()}
        server, signed_in = await complete_sign_in(services, query["state"], query["code"], None, h.send)
        assert (server, signed_in) == ("notes", True)
        await h.run()
        history = await h.history("t")
        assert _results(history) == ["notes of alice: buy milk; call Bob"]
        assert authority.grants == ["authorization_code"]


async def test_a_completion_for_a_call_that_does_not_wait_is_refused() -> None:
    h = Harness(FunctionModel(model))
    done = OAuthComplete(tool_call_id="nope", outcome="signed_in", server="notes")
    await h.send(InputMessage(content=done, group_id="t"), "nope-signed-in-1")
    await h.run()
    refused = [e for _, e in h.observer.events if isinstance(e, InputRejected)]
    assert [r.reason for r in refused] == [
        "sign-in ignored: there is no tool call nope waiting for a sign-in to notes in this thread"
    ]


async def test_a_runner_without_sign_ins_tells_the_model() -> None:
    async with oauth_server() as (base, _authority):
        tools = await load_mcp_tools([McpServer(name="notes", url=f"{base}/mcp", auth="oauth")])
        h = Harness(FunctionModel(model), tools)
        h.config.runner = InProcessFunctionRunner(tools)
        await h.say("t", "my notes", "m1")
        assert _results(await h.history("t")) == [
            "Error: MCP server 'notes' needs the user to sign in, which this runner cannot ask for"
        ]


async def test_a_callback_without_a_known_state_is_refused(tmp_path: Path) -> None:
    from stepagent.stores.memory import memory_stores
    from stepagent.tools.mcp_oauth import SignInRefused

    _, state = memory_stores()
    services = OAuthServices(store=state, cipher=LocalCipher.from_dir(tmp_path), redirect_uri=None)
    sent: list[str] = []

    async def send(message: InputMessage, dedup_id: str) -> None:
        sent.append(dedup_id)

    with pytest.raises(SignInRefused, match="no 'state'"):
        await complete_sign_in(services, None, "code", None, send)
    with pytest.raises(SignInRefused, match="unknown or has expired"):
        await complete_sign_in(services, "made-up", "code", None, send)
    assert sent == []


async def test_without_a_callback_url_the_model_is_told_what_to_set(tmp_path: Path) -> None:
    async with oauth_server() as (base, _authority):
        tools = await load_mcp_tools([McpServer(name="notes", url=f"{base}/mcp", auth="oauth")])
        h = Harness(FunctionModel(model), tools)
        runner = InProcessFunctionRunner(tools)
        runner.oauth = OAuthServices(store=h.state, cipher=LocalCipher.from_dir(tmp_path), redirect_uri=None)
        h.config.runner = runner
        await h.say("t", "my notes", "m1")
        [result] = _results(await h.history("t"))
        assert result is not None and "no callback URL is configured (set STEPAGENT_API_URL" in result
