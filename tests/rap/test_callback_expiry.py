"""RAP callback URLs are not forever: a genuine callback replayed after its call finished is refused (409)
on the receiver Lambda (moto) and nothing is enqueued — no stale sign-in link or question reaches the
user; a token's signed expiry binds results, sign-in links and questions but not subscription events; an
altered expiry is a forgery; tokens of the previous format keep working for calls still waiting. And the
local receiver checks the token before it reads a body, and stops reading once the body passes its cap."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from stepagent.rap.receiver import receive_callback
from stepagent.rap.receiver_app import deliver, receiver_app
from stepagent.rap.tokens import LIFETIME_S, callback_token, expiry_for
from stepagent.senders.inprocess import InProcessSender
from tests.rap.test_rap_on_moto import SECRET, rap_on_moto

NOW = 1_800_000_000.0
THREAD = "thread-1"
CALL = "call-1"


def v1_token(secret: str, thread: str, call: str) -> str:
    """A token as the previous release issued them (no expiry), for calls still in flight."""
    message = json.dumps(["stepagent-rap-callback/v1", thread, call], separators=(",", ":"))
    mac = hmac.new(secret.encode(), message.encode(), hashlib.sha256).digest()

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    return f"v1.{b64(call.encode())}.{b64(mac)}"


def callbacks(thread: str, call: str) -> dict[str, dict[str, Any]]:
    return {
        "tool_result": {"type": "tool_result", "group_id": thread, "id": call, "text": "forged result"},
        "oauth": {"type": "oauth", "group_id": thread, "id": call, "auth_url": "https://evil.example/login"},
        "user_choice": {
            "type": "user_choice",
            "group_id": thread,
            "id": call,
            "prompt": "Sign in again?",
            "choices": ["yes", "no"],
            "response_url": "https://evil.example/answer",
        },
    }


async def test_a_replayed_callback_after_the_call_finished_is_refused_on_the_receiver_lambda() -> None:
    async with rap_on_moto() as (stack, receiver_url, _demo):
        await stack.send_user("conv-replay", "what time is it?", "m1")
        async with asyncio.timeout(10):
            while len(await stack.texts("conv-replay")) < 4:  # the call's result is folded in
                await stack.pump()
                await asyncio.sleep(0.02)
        [call] = [
            json.loads(r["body"])
            for url, event, _ in stack.handled
            if url == stack.input_url
            for r in event["Records"]
            if '"toolresult"' in r["body"]
        ]
        call_id = call["content"]["id"]
        await stack.receive(stack.input_url)  # drain
        async with httpx.AsyncClient() as http:
            for token in (
                callback_token(SECRET, "conv-replay", call_id),
                v1_token(SECRET, "conv-replay", call_id),
            ):
                for kind, body in callbacks("conv-replay", call_id).items():
                    response = await http.post(f"{receiver_url}/?token={token}", json=body)
                    assert response.status_code == 409, (kind, response.text)
                    assert "no longer waiting" in response.json()["error"]
            # Subscription events are not answers to a waiting call: still accepted.
            event = {
                "type": "subscription_event",
                "group_id": "conv-replay",
                "tool_call_id": call_id,
                "text": "t",
            }
            token = callback_token(SECRET, "conv-replay", call_id)
            assert (await http.post(f"{receiver_url}/?token={token}", json=event)).status_code == 200
        queued = await stack.receive(stack.input_url)
        assert [json.loads(m["Body"])["content"]["type"] for m in queued] == ["toolresult"]  # the event only


def post(body: dict[str, Any], token: str, now: float) -> int:
    return receive_callback(json.dumps(body), token, "s3cret", now=now).status


def test_the_signed_expiry_binds_results_sign_ins_and_questions_but_not_subscription_events() -> None:
    issued = expiry_for(NOW)
    assert NOW + LIFETIME_S - 86_400 < issued <= NOW + LIFETIME_S
    token = callback_token("s3cret", THREAD, CALL, expires_at=issued)
    for kind, body in callbacks(THREAD, CALL).items():
        assert post(body, token, issued - 1) == 200, kind
        assert post(body, token, issued) == 403, kind
        result = receive_callback(json.dumps(body), token, "s3cret", now=issued + 1)
        assert "expired" in result.body["error"] and not result.messages
    event = {"type": "subscription_event", "group_id": THREAD, "tool_call_id": CALL, "text": "tick"}
    assert post(event, token, issued + 365 * 86_400) == 200
    # Moving the expiry forward without the secret is a forgery.
    version, call, _, mac = token.split(".")
    extended = ".".join([version, call, str(issued + 10 * LIFETIME_S), mac])
    assert post(callbacks(THREAD, CALL)["oauth"], extended, issued + 1) == 403
    assert post(callbacks(THREAD, CALL)["oauth"], extended, issued - 1) == 403
    # A token of the previous format has no expiry: it works, and the answered-call check guards it.
    assert post(callbacks(THREAD, CALL)["oauth"], v1_token("s3cret", THREAD, CALL), issued + 1) == 200


async def test_deliver_sends_an_answer_only_while_its_call_waits() -> None:
    answered: set[str] = set()

    async def filter_answered(thread: str, calls: Sequence[str]) -> set[str]:
        assert thread == THREAD
        return answered & set(calls)

    sender = InProcessSender()
    token = callback_token("s3cret", THREAD, CALL)
    result = receive_callback(json.dumps(callbacks(THREAD, CALL)["oauth"]), token, "s3cret")
    assert result.pending == (THREAD, CALL)
    assert (await deliver(result, sender, None, filter_answered)).status == 200
    assert len(sender.queue) == 1
    answered.add(CALL)
    refused = await deliver(result, sender, None, filter_answered)
    assert refused.status == 409 and len(sender.queue) == 1


async def never_answered(thread: str, calls: Sequence[str]) -> set[str]:
    return set()


class CountingBody:
    """A chunked upload of ``total`` bytes in 64 KiB chunks, counting what the server pulled."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunk = b"x" * 65_536
        while self.sent < self.total:
            self.sent += len(chunk)
            yield chunk


async def test_the_local_receiver_checks_the_token_first_and_streams_the_body_with_a_cap() -> None:
    cap = 1024 * 1024
    app = receiver_app("s3cret", InProcessSender(), answered=never_answered, max_bytes=cap)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://rx") as http:
        token = callback_token("s3cret", THREAD, CALL)
        body = CountingBody(200 * cap)  # 200 MiB, chunked (no Content-Length)
        response = await http.post(f"/?token={token}", content=body)
        assert response.status_code == 413 and "limit" in response.json()["error"]
        assert body.sent <= cap + 65_536  # read up to the cap and one chunk, never the rest
        # No token (or a malformed one): refused before a byte of the body is read.
        for query in ("", "?token=garbage"):
            body = CountingBody(200 * cap)
            response = await http.post(f"/{query}", content=body)
            assert response.status_code == 401, response.text
            assert body.sent <= 65_536  # at most what the transport hands over with the request
        # A genuine callback under the cap still goes through.
        ok = await http.post(f"/?token={token}", json=callbacks(THREAD, CALL)["tool_result"])
        assert ok.status_code == 200, ok.text
