"""``POST /v1/threads/{thread}/elicitations`` and ``Client.answer_input`` on a deployment-shaped stack (moto,
the real worker, JWTs checked against a loopback JWKS): ownership and bad bodies answer as for approvals,
a valid answer is queued for the thread, and one for a call that does not wait comes back as an
``error`` (``retrying: false``) — over the API's own client too."""

from __future__ import annotations

from typing import Any

import pytest

from stepagent.client import Client
from stepagent.client.http import ApiRequestError
from tests.api.helpers import api_stack, jwks_server, jwt_settings, new_thread, rsa_key
from tests.api.test_api import bearer, error_of
from tests.console.helpers import scripted_model


async def _refusal(client: Any, thread: str) -> list[dict[str, Any]]:
    return [i async for i in client.replies(thread, timeout=60) if i["kind"] == "error"]


async def test_answers_route_ownership_validation_and_refusal() -> None:
    key = rsa_key("rs-1")
    with jwks_server([key]) as jwks:
        async with api_stack(scripted_model(), jwt_settings(jwks.url)) as api:
            http = api.http
            alice, bob = bearer(key.token("alice")), bearer(key.token("bob"))
            thread = new_thread("ask")
            path = f"/v1/threads/{thread}/elicitations"
            answer = {"tool_call_id": "c1", "action": "accept", "content": {"reason": "old"}}

            error_of(await http.post(path, json=answer), 401, "unauthorized")
            error_of(await http.post(path, json=answer, headers=alice), 404, "not_found")  # no such thread
            sent = await http.post(f"/v1/threads/{thread}/messages", json={"text": "hello"}, headers=alice)
            assert sent.status_code == 202
            await api.client.wait(thread, sent.json()["message_id"], timeout=60)
            error_of(await http.post(path, json=answer, headers=bob), 404, "not_found")  # not bob's

            for bad in (
                {"tool_call_id": "c1", "action": "maybe"},
                {"action": "accept"},
                {"tool_call_id": "c1", "action": "accept", "user_id": "mallory"},
                {"tool_call_id": "c1", "action": "accept", "content": "not an object"},
            ):
                error_of(await http.post(path, json=bad, headers=alice), 400, "bad_request")

            queued = await http.post(path, json=answer, headers={**alice, "Idempotency-Key": "answer-1"})
            assert queued.status_code == 202 and queued.json() == {"message_id": "answer-1"}
            [refused] = await _refusal(api.client, thread)
            assert (
                "answer-1" in refused["text"] and "no tool call c1 waiting for an answer" in refused["text"]
            )
            assert refused["retrying"] is False

            # the client, over HTTP: the same route
            async with Client(api_url=api.url, token=key.token("alice")) as web:
                message_id = await web.answer_input(thread, "c2", "decline")
                [refused] = await _refusal(api.client, thread)
                assert message_id in refused["text"] and "c2" in refused["text"]
                with pytest.raises(ApiRequestError):
                    await web.answer_input(thread, "c3", "perhaps")
