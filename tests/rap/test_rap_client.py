"""The runtime's RAP client: invocation (reference RT1-RT4 and retries), discovery and its cache, and the
lifecycle notifier — against ``httpx.MockTransport`` servers, no network."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from botocore.credentials import Credentials

from stepagent.aws.settings import Settings
from stepagent.backoff import Backoff
from stepagent.core.effects import StoreToolAccess
from stepagent.errors import ConfigurationError, ToolError
from stepagent.rap.protocol import RapManifestError
from stepagent.rap.tokens import verify_token
from stepagent.senders.inprocess import InProcessSender
from stepagent.stores.memory import InMemoryStateStore, memory_stores
from stepagent.tools.base import ToolContext
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.rap import (
    CallbackConfig,
    RapNotifier,
    RapTool,
    fetch_manifest,
    load_rap_tools,
    owner_key,
)
from stepagent.tools.rap_http import RapHttp, RapServerConfig, SigV4Signer
from stepagent.tools.remote import load_remote

SECRET = "client-secret"
BASE = "http://tools.test"
ENDPOINT = "http://tools.test/invoke"


def manifest(name: str = "lookup", *, endpoint: str = ENDPOINT, **extra: Any) -> dict[str, Any]:
    tool = {"name": name, "description": "Look it up.", "inputSchema": {"type": "object", "properties": {}}}
    return {"name": "toolset", "endpoint": endpoint, "tools": [tool], **extra}


@dataclass
class FakeServer:
    """Answers requests by path; records every request."""

    manifest: dict[str, Any] = field(default_factory=manifest)
    statuses: list[int] = field(default_factory=list)  # invocation answers, consumed in order (default 200)
    fail_connect: int = 0  # how many requests raise ConnectError first
    requests: list[httpx.Request] = field(default_factory=list)

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.fail_connect:
            self.fail_connect -= 1
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/.well-known/rap-toolset":
            return httpx.Response(200, json=self.manifest)
        if request.url.path in ("/invoke", "/cancel_tool_call", "/close_thread"):
            return httpx.Response(self.statuses.pop(0) if self.statuses else 200, json={"ok": True})
        return httpx.Response(404)

    def posts(self, path: str) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests if r.method == "POST" and r.url.path == path]


@dataclass
class Env:
    server: FakeServer
    http: RapHttp
    sleeps: list[float]
    sender: InProcessSender
    state: InMemoryStateStore

    def context(
        self, thread: str = "thread-1", call: str = "tc-1", stack: list[str] | None = None, **kw: Any
    ) -> ToolContext:
        conversation, _ = memory_stores()
        return ToolContext(
            thread_id=thread,
            tool_call_id=call,
            call_id=kw.pop("call_id", "call-1"),
            thread_stack=stack or [thread],
            sender=self.sender,
            access=StoreToolAccess(conversation, self.state),
            **kw,
        )


def make_env(
    server: FakeServer | None = None, *, routes: Callable[[httpx.Request], httpx.Response] | None = None
) -> Env:
    server = server or FakeServer()
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    client = httpx.AsyncClient(transport=httpx.MockTransport(routes or server.handler))
    http = RapHttp(client, retry=Backoff(attempts=3, base=0.1, factor=2, jitter=0.0), sleep=sleep)
    _, state = memory_stores()
    return Env(server, http, sleeps, InProcessSender(), state)


async def rap_tool(env: Env, callbacks: CallbackConfig | None = None) -> RapTool:
    server = RapServerConfig(BASE)
    loaded = await load_rap_tools([server], env.http, env.state, callbacks or CallbackConfig(secret=SECRET))
    assert not loaded.errors
    return loaded.tools[0]


# ---- invocation ---------------------------------------------------------------------------------------------


async def test_rt1_non_2xx_after_retries_delivers_the_descriptive_error_result() -> None:
    env = make_env(FakeServer(statuses=[503, 503, 503]))
    tool = await rap_tool(env)
    await tool.execute({"q": "x"}, env.context(callback_url="https://rx.test/cb"))
    invocations = env.server.posts("/invoke")
    assert len(invocations) == 3 and invocations[0] == invocations[1] == invocations[2]  # same body, same id
    assert env.sleeps == [0.1, 0.2]
    [sent] = env.sender.sent
    assert sent.message_id == "tc-1" and sent.message.group_id == "thread-1"
    result = sent.message.content
    assert result.id == "tc-1" and result.call_id == "call-1"  # type: ignore[union-attr]
    assert result.first_text() == (  # type: ignore[union-attr]
        f"Error: RAP tool 'lookup' failed: the server at {ENDPOINT} responded with HTTP 503. "
        "No result will arrive for this call."
    )


async def test_a_5xx_then_2xx_is_accepted_without_a_result() -> None:
    env = make_env(FakeServer(statuses=[502, 200]))
    tool = await rap_tool(env)
    await tool.execute({}, env.context(callback_url="https://rx.test/cb"))
    assert len(env.server.posts("/invoke")) == 2 and env.sender.sent == []


async def test_a_4xx_is_not_retried() -> None:
    env = make_env(FakeServer(statuses=[404]))
    tool = await rap_tool(env)
    await tool.execute({}, env.context(callback_url="https://rx.test/cb"))
    assert len(env.server.posts("/invoke")) == 1 and env.sleeps == []
    assert "HTTP 404" in (env.sender.sent[0].message.content.first_text() or "")  # type: ignore[union-attr]


async def test_rt2_transport_failure_after_retries_is_a_tool_error_and_nothing_is_enqueued() -> None:
    env = make_env()
    tool = await rap_tool(env)
    env.server.fail_connect = 3
    with pytest.raises(ToolError, match=re.escape("could not reach the server at http://tools.test/invoke")):
        await tool.execute({}, env.context(callback_url="https://rx.test/cb"))
    assert env.sender.sent == []  # the step sends "Error: ..." with the tool call id as dedup id


async def test_a_transient_connect_error_is_retried_with_the_same_body() -> None:
    env = make_env()
    tool = await rap_tool(env)
    env.server.fail_connect = 1
    await tool.execute({"a": 1}, env.context(callback_url="https://rx.test/cb"))
    bodies = [r.content for r in env.server.requests if r.url.path == "/invoke"]
    assert len(bodies) == 2 and bodies[0] == bodies[1] and env.sender.sent == []


async def test_rt3_subthread_invocation_carries_ancestors_and_the_callback_override() -> None:
    env = make_env()
    tool = await rap_tool(env, CallbackConfig("https://override.test/cb", SECRET))
    context = env.context(
        "leaf", "tc-9", stack=["root", "middle", "leaf"], callback_url="https://ctx.test/cb"
    )
    await tool.execute({"q": "x"}, context)
    [body] = env.server.posts("/invoke")
    assert body["thread_ancestors"] == ["root", "middle"]
    assert body["callback_url"].startswith("https://override.test/cb?token=")
    assert env.sender.sent == []


async def test_rt4_root_invocation_has_the_exact_shape_and_a_token_for_its_call() -> None:
    env = make_env()
    tool = await rap_tool(env)
    await tool.execute({"q": "x"}, env.context(callback_url="https://rx.test/cb?stage=1", call_id=None))
    [body] = env.server.posts("/invoke")
    assert list(body) == [
        "operation",
        "arguments",
        "id",
        "call_id",
        "callback_url",
        "group_id",
        "thread_ancestors",
    ]
    assert body["operation"] == "lookup" and body["arguments"] == {"q": "x"} and body["id"] == "tc-1"
    assert body["call_id"] is None and body["group_id"] == "thread-1" and body["thread_ancestors"] is None
    query = parse_qs(urlsplit(body["callback_url"]).query)
    assert query["stage"] == ["1"]
    grant = verify_token(SECRET, "thread-1", query["token"][0])
    assert grant is not None and grant.tool_call_id == "tc-1" and grant.expires_at is not None


async def test_user_id_is_sent_when_known() -> None:
    env = make_env()
    tool = await rap_tool(env)
    await tool.execute({}, env.context(callback_url="https://rx.test/cb", user_id="slack:U1"))
    assert env.server.posts("/invoke")[0]["user_id"] == "slack:U1"


async def test_no_callback_url_is_a_tool_error() -> None:
    env = make_env()
    tool = await rap_tool(env)
    with pytest.raises(ToolError, match="STEPAGENT_CALLBACK_URL"):
        await tool.execute({}, env.context())
    assert env.server.posts("/invoke") == []


# ---- lifecycle ----------------------------------------------------------------------------------------------


async def test_cancel_goes_only_to_the_server_that_owns_the_call() -> None:
    a, b = FakeServer(), FakeServer(manifest=manifest("other", endpoint="http://b.test/invoke"))

    def route(request: httpx.Request) -> httpx.Response:
        return (a if request.url.host == "tools.test" else b).handler(request)

    env = make_env(a, routes=route)
    servers = [RapServerConfig(BASE), RapServerConfig("http://b.test")]
    loaded = await load_rap_tools(servers, env.http, env.state, CallbackConfig(secret=SECRET))
    assert [t.name for t in loaded.tools] == ["lookup", "other"]
    await loaded.tools[0].execute({}, env.context(callback_url="https://rx.test/cb"))
    assert await env.state.cache_get(owner_key("thread-1", "tc-1")) == BASE

    notifier = RapNotifier(servers, env.http, env.state)
    await notifier.cancel_tool_call("thread-1", "tc-1")
    await notifier.cancel_tool_call("thread-1", "not-a-rap-call")
    assert a.posts("/cancel_tool_call") == [{"thread_id": "thread-1", "tool_call_id": "tc-1"}]
    assert b.posts("/cancel_tool_call") == []

    await notifier.thread_closed("thread-1")
    assert a.posts("/close_thread") == b.posts("/close_thread") == [{"thread_id": "thread-1"}]


async def test_lifecycle_notifications_are_best_effort_and_never_retried() -> None:
    env = make_env(FakeServer(statuses=[500]))
    notifier = RapNotifier([RapServerConfig(BASE)], env.http, env.state)
    await notifier.thread_closed("t")  # a 500 is logged, not raised, not retried
    env.server.fail_connect = 5
    await notifier.thread_closed("t")  # nor is a connection failure
    assert len(env.server.posts("/close_thread")) == 2 and env.sleeps == []  # one attempt each


# ---- discovery ----------------------------------------------------------------------------------------------


async def test_manifests_are_cached_in_the_state_store_until_the_ttl() -> None:
    env = make_env()
    server = RapServerConfig(BASE)
    first = await fetch_manifest(server, env.http, env.state, ttl=60)
    again = await fetch_manifest(server, env.http, env.state, ttl=60)
    gets = [r for r in env.server.requests if r.method == "GET"]
    assert first == again and len(gets) == 1
    assert gets[0].url.path == "/.well-known/rap-toolset" and gets[0].headers["accept"] == "application/json"
    await env.state.cache_put(f"rap-toolset#{BASE}", first.to_json(), time.time() - 1)  # expired
    await fetch_manifest(server, env.http, env.state, ttl=60)
    assert len([r for r in env.server.requests if r.method == "GET"]) == 2


@pytest.mark.parametrize(
    ("broken", "fragment"),
    [
        ({"endpoint": ENDPOINT, "tools": []}, "name"),
        ({"name": "x", "endpoint": "ftp://nope", "tools": manifest()["tools"]}, "endpoint"),
        ({"name": "x", "endpoint": ENDPOINT, "tools": []}, "tools"),
        (
            {"name": "x", "endpoint": ENDPOINT, "tools": [{"name": "a", "inputSchema": {}}]},
            "tools[0].description",
        ),
        (
            {
                "name": "x",
                "endpoint": ENDPOINT,
                "tools": [{"name": "a b", "description": "d", "inputSchema": {}}],
            },
            "tools[0].name",
        ),
        (
            {
                "name": "x",
                "endpoint": ENDPOINT,
                "tools": [{"name": "a", "description": "d", "inputSchema": {"type": "string"}}],
            },
            "tools[0].inputSchema",
        ),
        ({"name": "x", "endpoint": ENDPOINT, "tools": manifest()["tools"] * 2}, "two tools are named"),
    ],
)
async def test_invalid_manifests_are_rejected_naming_the_server_and_field(
    broken: dict[str, Any], fragment: str
) -> None:
    env = make_env(FakeServer(manifest=broken))
    with pytest.raises(RapManifestError) as raised:
        await fetch_manifest(RapServerConfig(BASE), env.http, None)
    assert f"RAP server {BASE}" in str(raised.value) and fragment in str(raised.value)


async def test_an_unreachable_or_broken_server_is_reported_and_the_others_load() -> None:
    good = FakeServer()

    def route(request: httpx.Request) -> httpx.Response:
        if request.url.host == "down.test":
            raise httpx.ConnectError("refused", request=request)
        if request.url.host == "html.test":
            return httpx.Response(200, text="<html>")
        return good.handler(request)

    env = make_env(good, routes=route)
    servers = [
        RapServerConfig("http://down.test"),
        RapServerConfig("http://html.test"),
        RapServerConfig(BASE),
    ]
    loaded = await load_rap_tools(servers, env.http, env.state, CallbackConfig(secret=SECRET))
    assert [t.name for t in loaded.tools] == ["lookup"]
    assert len(loaded.errors) == 2
    assert "http://down.test" in loaded.errors[0] and "not JSON" in loaded.errors[1]


async def test_name_clashes_name_both_owners() -> None:
    env = make_env(FakeServer(manifest=manifest("spawn_thread")))
    with pytest.raises(ConfigurationError, match=re.escape(f"RAP server {BASE} offers 'spawn_thread'")):
        await load_rap_tools(
            [RapServerConfig(BASE)], env.http, env.state, CallbackConfig(), existing=builtin_tools()
        )

    def route(request: httpx.Request) -> httpx.Response:
        return FakeServer().handler(request)

    env = make_env(routes=route)
    servers = [RapServerConfig(BASE), RapServerConfig("http://b.test")]
    with pytest.raises(
        ConfigurationError,
        match=re.escape("RAP server http://b.test offers 'lookup', which RAP server http://tools.test"),
    ):
        await load_rap_tools(servers, env.http, env.state, CallbackConfig())


async def test_load_remote_requires_the_callback_settings() -> None:
    env = make_env()
    settings = Settings(rap_servers=(BASE,), callback_url="https://rx.test/cb")
    with pytest.raises(ConfigurationError, match="STEPAGENT_CALLBACK_SECRET"):
        await load_remote(settings, env.state, env.http.client, rap_http=env.http)
    settings = Settings(rap_servers=(BASE,), callback_url="https://rx.test/cb", callback_secret=SECRET)
    remote = await load_remote(settings, env.state, env.http.client, rap_http=env.http)
    assert [t.name for t in remote.tools] == ["lookup"] and isinstance(remote.notifier, RapNotifier)


# ---- SigV4 --------------------------------------------------------------------------------------------------


def test_server_entries_parse_the_sigv4_flag_and_the_region() -> None:
    plain = RapServerConfig.parse("https://tools.example.com/base/", default_region="eu-west-1")
    assert plain == RapServerConfig("https://tools.example.com/base", False, "eu-west-1")
    signed = RapServerConfig.parse("https://abc123.lambda-url.ap-south-1.on.aws/?sigv4=1&x=2")
    assert signed == RapServerConfig("https://abc123.lambda-url.ap-south-1.on.aws?x=2", True, "ap-south-1")
    assert signed.url("/close_thread") == "https://abc123.lambda-url.ap-south-1.on.aws/close_thread?x=2"


async def test_sigv4_servers_get_signed_requests_and_others_do_not() -> None:
    seen: list[httpx.Request] = []

    def route(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    client = httpx.AsyncClient(transport=httpx.MockTransport(route))
    http = RapHttp(client, signer=SigV4Signer(Credentials("AKIDEXAMPLE", "secret", "token")))
    signed = RapServerConfig.parse("https://abc.lambda-url.eu-west-1.on.aws?sigv4=1")
    await http.post(signed, signed.url("/invoke"), {"a": 1})
    await http.post(RapServerConfig(BASE), ENDPOINT, {"a": 1})
    auth = seen[0].headers["authorization"]
    assert auth.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/lambda/aws4_request" in auth and "x-amz-date" in seen[0].headers
    assert seen[0].headers["x-amz-security-token"] == "token"
    assert "authorization" not in seen[1].headers
