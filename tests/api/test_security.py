"""Attacks on the HTTP API, each as the attacker would make it, on a deployment-shaped stack (moto, the real
worker) behind a real loopback server with JWTs verified against a JWKS endpoint on loopback: forged resume
tokens, the no-auth subject, identity and profile claimed in the body, a reused Idempotency-Key, input the
worker would dead-letter, media types, response headers, and the server-minted thread ids."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, cast

import httpx
import pytest

from stepagent.api.app import ApiState, build_app
from stepagent.api.auth import ApiAuthSettings, Verifier
from stepagent.api.events import Position, ResumeTokens, tree_positions
from stepagent.api.keys import ApiKeys
from stepagent.api.policy import ApiPolicy, MetadataRefused
from stepagent.messages import ToolResult
from stepagent.providers.base import ModelRequest
from stepagent.stores.base import ThreadInfo, ThreadKind
from stepagent.stores.dynamodb.layout import head_item
from stepagent.tools.base import Tool, ToolContext
from tests.api.helpers import (
    AUDIENCE,
    ISSUER,
    Sse,
    SseParser,
    api_stack,
    jwks_server,
    jwt_settings,
    new_thread,
    rsa_key,
)
from tests.api.test_api import bearer, error_of
from tests.client.deployment import FunctionModel, Step, call, say
from tests.console.helpers import scripted_model


async def stream_events(http: httpx.AsyncClient, path: str, headers: dict[str, str]) -> list[Sse]:
    """Every event of one stream, read until the server ends it (200 expected)."""
    parser = SseParser()
    async with http.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        async for chunk in response.aiter_text():
            parser.feed(chunk)
    return [e for e in parser.events if e.data is not None]


async def plan_with_a_child(api: Any, thread: str, headers: dict[str, str]) -> str:
    """Start the scripted plan (a tool call, then a child thread) in ``thread``; the child's id once the
    whole tree has finished."""
    sent = await api.http.post(
        f"/v1/threads/{thread}/messages", json={"text": "plan the day"}, headers=headers
    )
    assert sent.status_code == 202, sent.text
    for _ in range(1200):
        texts = {item.get("text") for item in await api.client.history(thread)}
        if {"Got the report.", "Child finished."} <= texts:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the plan never finished")
    children = await api.client.conversation.children(thread)
    assert children
    return children[0].thread_id


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


async def test_a_forged_resume_token_is_refused_and_never_streams_another_users_events() -> None:
    rs = rsa_key("rs-1")
    keys = ApiKeys.from_secret("a deployment's callback secret")
    with jwks_server([rs]) as jwks:
        async with api_stack(scripted_model(), jwt_settings(jwks.url), keys=keys) as api:
            http = api.http
            alice, bob = bearer(rs.token("alice")), bearer(rs.token("bob"))
            mine, hers = new_thread("bob"), new_thread("alice")
            child = await plan_with_a_child(api, hers, alice)
            sent = await http.post(f"/v1/threads/{mine}/messages", json={"text": "hello"}, headers=bob)
            await api.client.wait(mine, sent.json()["message_id"], timeout=60)
            own = await stream_events(http, f"/v1/threads/{mine}/events", bob)
            genuine = own[-1].id
            assert genuine is not None

            # Bob's own token with Alice's root and child added to its positions (the signature kept) ...
            payload, _, mac = genuine.partition(".")
            positions = json.loads(unb64(payload))
            widened = {**positions, hers: [0, 0, 0, None, -1, 0], child: [0, 0, 0, 0, -1, 0]}
            forged = [
                f"{b64(json.dumps(widened).encode())}.{mac}",
                # ... the unsigned form a client could always write ...
                b64(json.dumps(widened).encode()),
                # ... one signed with a key of the attacker's ...
                ResumeTokens(b"guessed key" * 3).encode(mine, {mine: Position(), hers: Position()}),
                # ... and one the server signed for another root's stream.
                ResumeTokens(keys.resume).encode(hers, {hers: Position(), mine: Position()}),
            ]
            for token in forged:
                for request in (
                    {"headers": {**bob, "Last-Event-ID": token}},
                    {"headers": bob, "params": {"after": token}},
                ):
                    answer = await http.get(f"/v1/threads/{mine}/events", **request)  # type: ignore[arg-type]
                    error_of(answer, 400, "bad_request")
                    assert hers not in answer.text and child not in answer.text

            # Even a token the server itself signed (a leaked key, a bug) cannot widen the stream: on resume
            # only the threads the store records under the URL's root are read.
            signed = ResumeTokens(keys.resume).encode(
                mine, {mine: Position(), hers: Position(), child: Position(notices=0)}
            )
            resumed = await stream_events(
                http, f"/v1/threads/{mine}/events", {**bob, "Last-Event-ID": signed}
            )
            assert resumed and {e.data["thread_id"] for e in resumed} == {mine}
            assert [e.data["event_id"] for e in resumed if "event_id" in e.data] == [
                e.data["event_id"] for e in own if "event_id" in e.data
            ]

            # A genuine token still resumes: after the first event, exactly the ones after it.
            rest = await stream_events(
                http, f"/v1/threads/{mine}/events", {**bob, "Last-Event-ID": str(own[0].id)}
            )
            assert [e.data for e in rest] == [e.data for e in own[1:]]


async def test_a_subject_named_local_is_nobody_special_and_a_child_thread_is_its_roots_owners() -> None:
    rs = rsa_key("rs-1")
    with jwks_server([rs]) as jwks:
        async with api_stack(scripted_model(), jwt_settings(jwks.url)) as api:
            http = api.http
            local, alice, bob = (bearer(rs.token(name)) for name in ("local", "alice", "bob"))
            approval = {"tool_call_id": "c1", "decision": "approve"}

            # A thread made outside the API (the CLI's) has no owner: unreachable in jwt mode, whatever the
            # token's subject says.
            cli = new_thread("cli")
            await api.client.wait(cli, await api.client.send(cli, "hello"), timeout=60)
            for name, headers in (("local", local), ("alice", alice)):
                path = f"/v1/threads/{cli}"
                error_of(await http.get(path, headers=headers), 404, "not_found")
                error_of(await http.get(path + "/events", headers=headers), 404, "not_found")
                sent = await http.post(path + "/messages", json={"text": f"hi from {name}"}, headers=headers)
                error_of(sent, 404, "not_found")
                error_of(
                    await http.post(path + "/approvals", json=approval, headers=headers), 404, "not_found"
                )

            # Alice's child thread is hers: by its own id too.
            root = new_thread("alice")
            child = await plan_with_a_child(api, root, alice)
            history = await http.get(f"/v1/threads/{child}", headers=alice)
            assert history.status_code == 200, history.text
            assert history.json() and {item["thread_id"] for item in history.json()} == {child}
            async with http.stream("GET", f"/v1/threads/{child}/events?follow=1", headers=alice) as events:
                assert events.status_code == 200
                parser = SseParser()
                async for chunk in events.aiter_text():
                    if [e for e in parser.feed(chunk) if e.data is not None]:
                        break
                assert next(e for e in parser.events if e.data is not None).data["thread_id"] == child
            sent = await http.post(f"/v1/threads/{child}/approvals", json=approval, headers=alice)
            assert sent.status_code == 202, sent.text
            # Nobody else's: Bob, and a token whose subject is "local".
            for headers in (bob, local):
                path = f"/v1/threads/{child}"
                error_of(await http.get(path, headers=headers), 404, "not_found")
                error_of(await http.get(path + "/events", headers=headers), 404, "not_found")
                error_of(
                    await http.post(path + "/approvals", json=approval, headers=headers), 404, "not_found"
                )
                error_of(
                    await http.post(path + "/messages", json={"text": "x"}, headers=headers), 404, "not_found"
                )

            # Without authentication (a loopback-only mode) the CLI's thread is reachable, as it always was.
            app = build_app(ApiState(api.client, Verifier(ApiAuthSettings(mode="none"))))
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://local"
            ) as off:
                assert (await off.get(f"/v1/threads/{cli}")).status_code == 200


class WhoAmI(Tool):
    """Answers with the user the runtime says it acts for."""

    name = "whoami"
    description = "Who the tool acts for."
    inline = True

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        self.seen.append((context.thread_id, context.user_id))
        return ToolResult.text(context.tool_call_id, str(context.user_id))


def whoami_model() -> FunctionModel:
    def reply(text: str, request: ModelRequest) -> list[Step]:
        if text.startswith("who am i"):
            return call("whoami", f"who-{len(request.history)}")
        return say(f"You are {text}.")

    return FunctionModel(reply)


async def test_identity_comes_from_the_token_never_the_body() -> None:
    rs = rsa_key("rs-1")
    tool = WhoAmI()
    with jwks_server([rs]) as jwks:
        async with api_stack(whoami_model(), jwt_settings(jwks.url), tools=[tool]) as api:
            http = api.http
            alice, bob = bearer(rs.token("alice")), bearer(rs.token("bob"))

            async def ask(thread: str, headers: dict[str, str], metadata: Any = None) -> str | None:
                body: dict[str, Any] = {"text": "who am i"}
                if metadata is not None:
                    body["metadata"] = metadata
                sent = await http.post(f"/v1/threads/{thread}/messages", json=body, headers=headers)
                assert sent.status_code == 202, sent.text
                await api.client.wait(thread, sent.json()["message_id"], timeout=60)
                return next(user for seen_in, user in reversed(tool.seen) if seen_in == thread)

            hers = new_thread("alice")
            assert await ask(hers, alice, {"app": 1}) == "alice"
            assert await api.client.state.get_metadata(hers) == {"app": 1, "user_id": "alice"}
            # A later message without metadata keeps the conversation's (the subject included).
            assert await ask(hers, alice) == "alice"
            assert await api.client.state.get_metadata(hers) == {"app": 1, "user_id": "alice"}
            assert await ask(new_thread("alice"), alice) == "alice"  # a first message without metadata

            # Bob claims to be Alice: refused, and nothing runs for him.
            his = new_thread("bob")
            seen = len(tool.seen)
            for metadata in ({"user_id": "alice"}, {"user_id": "bob"}):
                refused = await http.post(
                    f"/v1/threads/{his}/messages",
                    json={"text": "who am i", "metadata": metadata},
                    headers=bob,
                )
                assert "user_id" in error_of(refused, 400, "bad_request")
            error_of(
                await http.post(
                    f"/v1/threads/{his}/messages", json={"text": "x", "metadata": "alice"}, headers=bob
                ),
                400,
                "bad_request",
            )
            # ... nor may he pick an agent profile the deployment did not open to callers.
            chosen = await http.post(
                f"/v1/threads/{his}/messages",
                json={"text": "x", "metadata": {"profile": "admin"}},
                headers=bob,
            )
            assert "admin" in error_of(chosen, 422, "profile_not_allowed")
            await asyncio.sleep(0.3)  # time enough for a message to be taken, had one been sent
            assert len(tool.seen) == seen
            assert await api.client.conversation.get_thread(his) is None
            assert await ask(his, bob) == "bob"


def test_the_profile_allow_list_is_the_deployments() -> None:
    policy = ApiPolicy.from_env({"STEPAGENT_API_PROFILES": " support , sales,"})
    assert policy.profiles == {"support", "sales"}
    assert policy.metadata({"profile": "support"}, "alice", new_thread=True) == {
        "profile": "support",
        "user_id": "alice",
    }
    for metadata in ({"profile": "admin"}, {"profile": None}, {"profile": ["support"]}):
        try:
            policy.metadata(metadata, "alice", new_thread=True)
        except MetadataRefused as refused:
            assert (refused.status, refused.code) == (422, "profile_not_allowed")
        else:
            raise AssertionError(f"{metadata} was accepted")
    assert ApiPolicy().profiles == frozenset()  # the default: no profile selectable
    # Without authentication nobody has an identity to set; the reserved key is refused all the same.
    assert ApiPolicy().metadata(None, None, new_thread=True) is None
    assert ApiPolicy().metadata("text", None, new_thread=True) == "text"


async def test_an_idempotency_key_reused_with_another_body_is_a_422() -> None:
    rs = rsa_key("rs-1")
    with jwks_server([rs]) as jwks:
        async with api_stack(scripted_model(), jwt_settings(jwks.url)) as api:
            http = api.http
            alice = bearer(rs.token("alice"))
            thread = new_thread("idem")
            keyed = {**alice, "Idempotency-Key": "msg-1"}
            path = f"/v1/threads/{thread}/messages"
            first = await http.post(path, json={"text": "hello", "metadata": {"a": 1, "b": 2}}, headers=keyed)
            assert first.status_code == 202 and first.json() == {"message_id": "msg-1"}
            # The same request again (its keys in another order): the same answer.
            again = await http.post(path, json={"metadata": {"b": 2, "a": 1}, "text": "hello"}, headers=keyed)
            assert again.status_code == 202 and again.json() == {"message_id": "msg-1"}
            message = error_of(
                await http.post(path, json={"text": "goodbye"}, headers=keyed), 422, "idempotency_key_reused"
            )
            assert "msg-1" in message
            approval = {"tool_call_id": "c1", "decision": "approve"}
            error_of(
                await http.post(f"/v1/threads/{thread}/approvals", json=approval, headers=keyed),
                422,
                "idempotency_key_reused",
            )
            await api.client.wait(thread, "msg-1", timeout=60)
            assert [i.get("text") for i in await api.client.history(thread)] == [
                "hello",
                "Hello back, friend.",
            ]
            # A key is the thread's: the same key in another conversation is another message.
            other = await http.post(
                f"/v1/threads/{new_thread('idem')}/messages", json={"text": "hi"}, headers=keyed
            )
            assert other.status_code == 202


async def test_input_the_worker_would_dead_letter_is_a_400() -> None:
    rs = rsa_key("rs-1")
    with jwks_server([rs]) as jwks:
        async with api_stack(scripted_model(), jwt_settings(jwks.url)) as api:
            http = api.http
            alice = bearer(rs.token("alice"))
            thread = new_thread("rules")
            hello = {"text": "hello"}
            assert (
                await http.post(f"/v1/threads/{thread}/messages", json=hello, headers=alice)
            ).status_code == 202

            # Thread ids SQS refuses as a MessageGroupId (U+FFFF, a space, non-ASCII, over 128 characters).
            for bad in ("x%EF%BF%BF", "a%20b", "caf%C3%A9", "t" * 129):
                for method, suffix, body in (
                    ("POST", "/messages", hello),
                    ("GET", "", None),
                    ("GET", "/events", None),
                ):
                    answer = await http.request(
                        method, f"/v1/threads/{bad}{suffix}", json=body, headers=alice
                    )
                    assert "thread id" in error_of(answer, 400, "bad_request")
            longest = await http.post(f"/v1/threads/{'t' * 128}/messages", json=hello, headers=alice)
            assert longest.status_code == 202, longest.text
            # A tool_call_id over the worker's id limit; an empty or blank message.
            approval = {"tool_call_id": "c" * 600, "decision": "approve"}
            answer = await http.post(f"/v1/threads/{thread}/approvals", json=approval, headers=alice)
            assert "tool_call_id" in error_of(answer, 400, "bad_request")
            for text in ("", "  \n"):
                answer = await http.post(f"/v1/threads/{thread}/messages", json={"text": text}, headers=alice)
                assert "empty" in error_of(answer, 400, "bad_request")


async def test_a_post_body_that_is_not_json_is_a_415() -> None:
    rs = rsa_key("rs-1")
    with jwks_server([rs]) as jwks:
        async with api_stack(scripted_model(), jwt_settings(jwks.url)) as api:
            alice = bearer(rs.token("alice"))
            path = f"/v1/threads/{new_thread('media')}/messages"
            raw = json.dumps({"text": "hello"})
            for content_type in (
                "text/plain",
                "application/x-www-form-urlencoded",
                "application/jsonp",
                None,
            ):
                headers = {**alice, **({"Content-Type": content_type} if content_type else {})}
                error_of(
                    await api.http.post(path, content=raw, headers=headers), 415, "unsupported_media_type"
                )
            approval = json.dumps({"tool_call_id": "c1", "decision": "approve"})
            answer = await api.http.post(
                path.replace("/messages", "/approvals"), content=approval, headers=alice
            )
            error_of(answer, 415, "unsupported_media_type")
            # Parameters are allowed, and the type is case-insensitive.
            charset = {**alice, "Content-Type": "Application/JSON; charset=utf-8"}
            assert (await api.http.post(path, content=raw, headers=charset)).status_code == 202


async def test_json_answers_are_neither_sniffed_nor_cached() -> None:
    rs = rsa_key("rs-1")
    with jwks_server([rs]) as jwks:
        async with api_stack(scripted_model(), jwt_settings(jwks.url)) as api:
            http = api.http
            alice = bearer(rs.token("alice"))
            thread = new_thread("headers")
            answers = [
                await http.post(f"/v1/threads/{thread}/messages", json={"text": "hello"}, headers=alice),
                await http.post(f"/v1/threads/{thread}/messages", json={"text": ""}, headers=alice),
                await http.get(f"/v1/threads/{thread}", headers=alice),
                await http.get(f"/v1/threads/{thread}"),
                await http.get(f"/v1/threads/{new_thread('none')}", headers=alice),
                await http.get("/v2/nothing"),
                await http.delete(f"/v1/threads/{thread}", headers=alice),
                await http.post("/v1/threads", json={"text": "hello"}, headers=alice),
            ]
            for answer in answers:
                assert answer.headers.get("x-content-type-options") == "nosniff", answer.url
                assert answer.headers.get("cache-control") == "no-store", answer.url
            assert [a.status_code for a in answers] == [202, 400, 200, 401, 404, 404, 405, 201]


async def test_a_new_conversation_under_an_id_the_server_makes() -> None:
    rs = rsa_key("rs-1")
    with jwks_server([rs]) as jwks:
        async with api_stack(scripted_model(), jwt_settings(jwks.url)) as api:
            http = api.http
            alice, bob = bearer(rs.token("alice")), bearer(rs.token("bob"))
            made = await http.post("/v1/threads", json={"text": "hello"}, headers=alice)
            assert made.status_code == 201, made.text
            thread, message_id = made.json()["thread_id"], made.json()["message_id"]
            assert set(made.json()) == {"thread_id", "message_id"}
            another = (await http.post("/v1/threads", json={"text": "hello"}, headers=alice)).json()
            assert another["thread_id"] != thread and len(thread) >= 32
            await api.client.wait(thread, message_id, timeout=60)
            items = (await http.get(f"/v1/threads/{thread}", headers=alice)).json()
            assert [i["text"] for i in items] == ["hello", "Hello back, friend."]
            error_of(await http.get(f"/v1/threads/{thread}", headers=bob), 404, "not_found")

            # With an Idempotency-Key a retry names the same thread; the same key of another user, another.
            keyed = {**alice, "Idempotency-Key": "start-1"}
            first = await http.post("/v1/threads", json={"text": "hello"}, headers=keyed)
            retry = await http.post("/v1/threads", json={"text": "hello"}, headers=keyed)
            assert first.status_code == retry.status_code == 201
            assert first.json() == retry.json() and first.json()["message_id"] == "start-1"
            error_of(
                await http.post("/v1/threads", json={"text": "other"}, headers=keyed),
                422,
                "idempotency_key_reused",
            )
            his = await http.post(
                "/v1/threads", json={"text": "hello"}, headers={**bob, "Idempotency-Key": "start-1"}
            )
            assert his.status_code == 201 and his.json()["thread_id"] != first.json()["thread_id"]
            # The rules of any message hold here too.
            error_of(await http.post("/v1/threads", json={"text": ""}, headers=alice), 400, "bad_request")
            error_of(
                await http.post(
                    "/v1/threads", json={"text": "x", "metadata": {"user_id": "bob"}}, headers=alice
                ),
                400,
                "bad_request",
            )
            error_of(await http.post("/v1/threads", json={"text": "x"}), 401, "unauthorized")


async def test_a_resumed_stream_keeps_only_threads_the_store_records_under_the_urls_thread() -> None:
    def head(thread: str, parent: str | None, root: str) -> Any:
        kind = ThreadKind.ROOT if parent is None else ThreadKind.CHILD
        return head_item(ThreadInfo(thread_id=thread, root_id=root, parent_id=parent, kind=kind))

    heads = {
        "child": head("child", "root", "root"),
        "grandchild": head("grandchild", "child", "root"),
        "sibling": head("sibling", "root", "root"),
        "foreign": head("foreign", None, "foreign"),
        "foreign-child": head("foreign-child", "foreign", "foreign"),
    }

    class Reader:
        async def heads_and_live(self, threads: list[str]) -> dict[str, tuple[Any, Any]]:
            return {t: (heads.get(t), None) for t in threads}

    reader = cast(Any, Reader())
    named = ["root", "child", "grandchild", "sibling", "foreign", "foreign-child", "unknown"]
    positions = {t: Position(order=n) for n, t in enumerate(named)}
    kept = await tree_positions(reader, "root", positions)
    assert list(kept) == ["root", "child", "grandchild", "sibling"]
    assert kept["grandchild"] is positions["grandchild"]  # positions kept as they were
    # A child's own stream: its subtree only (not its parent's, its sibling's or anyone else's).
    of_child = {t: positions[t] for t in ("child", "grandchild", "root", "sibling", "foreign")}
    assert list(await tree_positions(reader, "child", of_child)) == ["child", "grandchild"]


def test_every_instance_derives_the_same_keys_and_each_purpose_its_own() -> None:
    one, two = ApiKeys.from_secret("shared"), ApiKeys.from_secret("shared")
    token = ResumeTokens(one.resume).encode("t", {"t": Position(order=3)})
    assert ResumeTokens(two.resume).decode(token, "t")["t"].order == 3  # another instance resumes it
    keys = {one.resume, one.thread_ids, b"shared", ApiKeys.from_secret("other").resume}
    assert len(keys) == 4  # neither the secret itself nor another purpose's key
    assert "shared" not in repr(one) and one.resume.hex() not in repr(one)


async def test_the_lambda_app_refuses_to_start_without_the_callback_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stepagent.api.lambda_app import LambdaApi

    rs = rsa_key("rs-1")
    for name in ("STEPAGENT_JWT_JWKS_URL", "STEPAGENT_CALLBACK_SECRET", "STEPAGENT_CALLBACK_SECRET_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STEPAGENT_API_AUTH", "jwt")
    monkeypatch.setenv("STEPAGENT_JWT_PUBLIC_KEY", rs.pem())
    monkeypatch.setenv("STEPAGENT_JWT_ISSUER", ISSUER)
    monkeypatch.setenv("STEPAGENT_JWT_AUDIENCE", AUDIENCE)
    monkeypatch.setenv("STEPAGENT_CONVERSATION_TABLE", "conversation")
    monkeypatch.setenv("STEPAGENT_STATE_TABLE", "state")
    monkeypatch.setenv("STEPAGENT_INPUT_QUEUE_URL", "http://127.0.0.1:9/queue.fifo")
    app = LambdaApi()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://lambda") as http:
        answer = await http.get("/v1/threads/t")
        assert "STEPAGENT_CALLBACK_SECRET" in error_of(answer, 500, "configuration")
        assert answer.headers["x-content-type-options"] == "nosniff"
        monkeypatch.setenv("STEPAGENT_CALLBACK_SECRET", "the deployment's secret")
        error_of(await http.get("/v1/threads/t"), 401, "unauthorized")  # configured now: it asks who you are
    if app._client is not None:
        await app._client.close()
