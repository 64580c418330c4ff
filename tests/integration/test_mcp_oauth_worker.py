"""Per-user OAuth for an MCP server, through the real worker and tool runner on moto, the real HTTP API's
callback and a REAL OAuth-protected MCP server (``examples/oauth_mcp_server.py``: the ``mcp`` SDK's
authorization server with registration, PKCE, refresh and revocation, and a protected streamable-HTTP
endpoint). The "browser" is plain HTTP: a GET of the ``oauth_required`` URL that follows the redirects to
the API's ``GET /v1/oauth/callback``.

Covered: the sign-in, after which the call resumes and the model sees the real result; a second call that
reuses the token; a refresh once the token expired; a revoked token (asked again); a declined sign-in (the
model sees the error); a replayed callback (400, "already used"); crashes between the callback's token
write and its resume message, and between the resume and the dispatch (nothing lost, the call runs
once). Tokens are sealed with a KMS key (moto); none of them is readable in the state table.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from stepagent.api.auth import ApiAuthSettings
from stepagent.api.server import open_api
from stepagent.aws.oauth_setup import open_oauth
from stepagent.client import Client
from stepagent.core.effects import StepEffects
from stepagent.errors import ConfigurationError
from stepagent.tools.mcp_oauth import CALLBACK_PATH
from stepagent.tools.mcp_session import forget_all
from tests.conftest import aws_client
from tests.integration.aws_helpers import Stack, aws_stack
from tests.mcp.fixtures.oauth import oauth_server

SCRIPT: dict[str, Any] = {
    "rules": [
        {
            "when": "my notes",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "notes__my_notes", "arguments": {}}}],
        },
        {"when": "^notes of", "on": ["tool_result"], "reply": [{"text": "Here they are."}]},
        {"when": "declined to sign in", "on": ["tool_result"], "reply": [{"text": "Not signed in."}]},
    ],
    "default": [{"text": "ok"}],
}

ALICE_NOTES = "notes of alice: buy milk; call Bob"


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


@dataclass
class OAuthWorld:
    stack: Stack
    authority: Any
    api_url: str
    browser: httpx.AsyncClient
    kms: Any

    async def ask(self, thread: str, message_id: str, user: str | None = "alice") -> list[dict[str, Any]]:
        """Send "my notes" as ``user`` (the root metadata's ``user_id``, as the API sets it) and pump."""
        metadata = {"user_id": user} if user is not None else None
        await self.stack.runtime.sender.send(
            _user_text(thread, "show my notes", message_id, metadata), message_id
        )
        await self.stack.pump()
        return await self.stack.outputs()

    async def sign_in(self, auth_url: str) -> httpx.Response:
        """The person opens the link: the authorization server answers at once and redirects back."""
        return await self.browser.get(auth_url, follow_redirects=True)


def _user_text(thread: str, text: str, message_id: str, metadata: Any) -> Any:
    from stepagent.messages import InputMessage

    return InputMessage.user_text(thread, text, id=message_id, metadata=metadata)


@asynccontextmanager
async def oauth_world(**runtime_options: Any) -> AsyncIterator[OAuthWorld]:
    forget_all()
    async with AsyncExitStack() as opened:
        base, authority = await opened.enter_async_context(oauth_server())
        kms = await opened.enter_async_context(aws_client("kms"))
        key_id = (await kms.create_key(Description="stepagent oauth tokens"))["KeyMetadata"]["KeyId"]
        servers = [{"name": "notes", "url": f"{base}/mcp", "auth": "oauth"}]
        env = {"STEPAGENT_MCP_SERVERS": json.dumps(servers), "STEPAGENT_OAUTH_KEY_ID": key_id}
        stack = await opened.enter_async_context(aws_stack(script=SCRIPT, env=env, **runtime_options))
        client = await opened.enter_async_context(Client(settings=stack.settings))
        api_oauth = await open_oauth(stack.settings, client.state, opened, required=True)
        api_url = await opened.enter_async_context(
            open_api(client, ApiAuthSettings(mode="none"), port=0, oauth=api_oauth)
        )
        # The tool runner learns the API's public URL (STEPAGENT_API_URL) only now that it listens.
        assert stack.runtime.oauth is not None
        stack.runtime.oauth = dataclasses.replace(stack.runtime.oauth, redirect_uri=api_url + CALLBACK_PATH)
        browser = await opened.enter_async_context(httpx.AsyncClient(timeout=30))
        yield OAuthWorld(stack, authority, api_url, browser, kms)
    forget_all()


async def _state_items(stack: Stack, table: str | None = None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    paginator = stack.dynamodb.get_paginator("scan")
    async for page in paginator.paginate(TableName=table or stack.settings.state_table):
        items.extend(page["Items"])
    return items


async def test_sign_in_resumes_the_call_and_the_next_call_reuses_the_token() -> None:
    async with oauth_world() as world:
        events = await world.ask("conv-oauth", "m1")
        [asked] = of(events, "oauth_required")
        [called] = of(events, "tool_call")
        assert asked["tool_call_id"] == called["tool_call_id"]
        assert "code_challenge_method=S256" in asked["auth_url"] and "state=" in asked["auth_url"]
        assert of(events, "turn_complete") == []  # the call waits; nothing runs

        page = await world.sign_in(asked["auth_url"])
        assert page.status_code == 200 and "Signed in to notes. You can close this tab." in page.text
        await world.stack.pump()
        texts = await world.stack.texts("conv-oauth")
        assert texts[-2:] == [ALICE_NOTES, "Here they are."]  # the model saw the real result
        assert of(await world.stack.outputs(), "turn_complete")
        assert world.authority.grants == ["authorization_code"]

        # the same link again: refused, and nothing runs twice
        again = await world.sign_in(asked["auth_url"])
        assert again.status_code == 400 and "already used" in again.text
        await world.stack.pump()
        assert (await world.stack.texts("conv-oauth")).count(ALICE_NOTES) == 1

        # a second call of the same user (another conversation): no sign-in, the kept token is used
        events = await world.ask("conv-oauth-2", "m2")
        assert of(events, "oauth_required") == []
        assert (await world.stack.texts("conv-oauth-2"))[-2:] == [ALICE_NOTES, "Here they are."]

        # tokens are sealed: no access or refresh token is readable anywhere in the state table
        dump = json.dumps(await _state_items(world.stack))
        assert world.authority.issued and not any(token in dump for token in world.authority.issued)


async def test_an_expired_token_is_refreshed_before_the_call() -> None:
    async with oauth_world() as world:
        [asked] = of(await world.ask("conv-refresh", "m1"), "oauth_required")
        await world.sign_in(asked["auth_url"])
        await world.stack.pump()
        oauth = world.stack.runtime.oauth
        assert oauth is not None
        world.authority.expire_access_tokens()  # the server no longer accepts them ...
        later = oauth.clock() + 7200  # ... and the client's clock says they expired
        world.stack.runtime.oauth = dataclasses.replace(oauth, clock=lambda: later)
        events = await world.ask("conv-refresh-2", "m2")
        assert of(events, "oauth_required") == []
        assert (await world.stack.texts("conv-refresh-2"))[-2:] == [ALICE_NOTES, "Here they are."]
        assert world.authority.grants == ["authorization_code", "refresh_token"]


async def test_a_revoked_token_asks_the_person_again() -> None:
    async with oauth_world() as world:
        [first] = of(await world.ask("conv-revoked", "m1"), "oauth_required")
        await world.sign_in(first["auth_url"])
        await world.stack.pump()
        world.authority.revoke_all()
        events = await world.ask("conv-revoked", "m2")
        [second] = of(events, "oauth_required")
        assert second["auth_url"] != first["auth_url"]
        page = await world.sign_in(second["auth_url"])
        assert page.status_code == 200
        await world.stack.pump()
        assert (await world.stack.texts("conv-revoked")).count(ALICE_NOTES) == 2
        assert world.authority.grants == ["authorization_code", "authorization_code"]


async def test_a_declined_sign_in_ends_the_call_with_an_error_the_model_sees() -> None:
    async with oauth_world() as world:
        [asked] = of(await world.ask("conv-declined", "m1"), "oauth_required")
        world.authority.consent = False
        page = await world.sign_in(asked["auth_url"])
        assert page.status_code == 200 and "declined to sign in to notes" in page.text
        await world.stack.pump()
        texts = await world.stack.texts("conv-declined")
        assert texts[-2:] == ["Error: the user declined to sign in to notes", "Not signed in."]
        assert world.authority.grants == []


async def test_a_crash_between_the_token_write_and_the_resume_message_loses_nothing() -> None:
    async with oauth_world() as world:
        [asked] = of(await world.ask("conv-crash-1", "m1"), "oauth_required")
        sender = world.stack.runtime.sender
        # The API's sender is its client's; make its first send fail as a crash would.
        api_sender = type(sender)
        real_send = api_sender.send
        crashed: list[str] = []

        async def crash_once(self: Any, message: Any, dedup_id: str) -> None:
            if "-signed-in-" in dedup_id and not crashed:
                crashed.append(dedup_id)
                raise ConnectionError("the API instance died here")
            await real_send(self, message, dedup_id)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(api_sender, "send", crash_once)
            died = await world.sign_in(asked["auth_url"])
            assert died.status_code == 500  # the instance died mid-request: the browser sees an error
        assert crashed
        await world.stack.pump()
        assert ALICE_NOTES not in await world.stack.texts("conv-crash-1")  # nothing resumed yet

        page = await world.sign_in(asked["auth_url"])  # the person reloads the page
        assert page.status_code == 200 and "Signed in to notes" in page.text
        await world.stack.pump()
        texts = await world.stack.texts("conv-crash-1")
        assert texts.count(ALICE_NOTES) == 1 and texts[-1] == "Here they are."
        assert world.authority.grants == ["authorization_code"]  # the code was exchanged once


async def test_a_crash_between_the_resume_and_the_dispatch_runs_the_call_once() -> None:
    async with oauth_world() as world:
        [asked] = of(await world.ask("conv-crash-2", "m1"), "oauth_required")
        real_dispatch = StepEffects.dispatch
        crashed: list[str] = []

        async def crash_once(self: StepEffects, intent: Any) -> None:
            if not crashed:
                crashed.append(intent.tool_call_id)
                raise ConnectionError("the worker died after committing the resume")
            await real_dispatch(self, intent)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(StepEffects, "dispatch", crash_once)
            await world.sign_in(asked["auth_url"])
            await world.stack.pump()
        assert crashed
        await world.stack.pump()
        texts = await world.stack.texts("conv-crash-2")
        assert texts.count(ALICE_NOTES) == 1 and texts[-1] == "Here they are."


async def test_only_the_tool_runner_needs_the_token_key() -> None:
    async with oauth_server() as (base, _authority):
        env = {
            "STEPAGENT_MCP_SERVERS": json.dumps([{"name": "notes", "url": f"{base}/mcp", "auth": "oauth"}])
        }
        async with aws_stack(script=SCRIPT, env=env, roles=["worker"]) as stack:
            assert stack.runtime.oauth is None  # a worker alone never opens a user's tokens
        with pytest.raises(ConfigurationError, match="set STEPAGENT_OAUTH_KEY_ID"):
            async with aws_stack(script=SCRIPT, env=env, roles=["tool_runner"]):
                pass
