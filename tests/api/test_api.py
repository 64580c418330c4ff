"""The HTTP API's JSON routes on a deployment-shaped stack (moto, the real worker), behind a real loopback
server, with JWTs verified against a JWKS endpoint on loopback: auth failures, ownership, bad input,
idempotent sends, history and approvals — each outcome with its status and JSON error."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import jwt
import pytest

from stepagent.api.server import auth_settings
from stepagent.client import Client
from stepagent.client.http import ApiRequestError
from stepagent.errors import ConfigurationError
from stepagent.input_rules import MAX_MESSAGE_BYTES
from tests.api.helpers import (
    AUDIENCE,
    ISSUER,
    api_stack,
    ec_key,
    jwks_server,
    jwt_settings,
    new_thread,
    rsa_key,
)
from tests.console.helpers import scripted_model


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def hs256_with_public_key(pem: str) -> str:
    """The key-confusion forgery: HMAC-signed with the (public) RSA key as the secret."""
    header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "rs-1"}).encode())
    claims = {"sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "exp": 4_000_000_000}
    body = b64(json.dumps(claims).encode())
    signature = hmac.new(pem.encode(), f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{b64(signature)}"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def error_of(response: object, status: int, code: str) -> str:
    assert response.status_code == status, response.text  # type: ignore[attr-defined]
    body = response.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    return str(body["error"]["message"])


async def test_auth_ownership_bad_input_idempotency_history_and_approvals() -> None:
    rs, es = rsa_key("rs-1"), ec_key("es-1")
    with jwks_server([rs, es]) as jwks:
        async with api_stack(scripted_model(), jwt_settings(jwks.url), max_streams=2) as api:
            http = api.http
            alice, bob = bearer(rs.token("alice")), bearer(es.token("bob"))
            thread = new_thread("api")
            path = f"/v1/threads/{thread}"

            # ---- authentication: each bad credential is a 401 with a JSON error
            error_of(await http.get(path), 401, "unauthorized")
            error_of(await http.get(path, headers={"Authorization": "Basic x"}), 401, "unauthorized")
            error_of(await http.get(path, headers=bearer("not-a-jwt")), 401, "unauthorized")
            expired = rs.token(exp=1_000_000, iat=999_000)
            assert "expired" in error_of(await http.get(path, headers=bearer(expired)), 401, "unauthorized")
            forger = rsa_key("rs-1")  # same kid, another private key
            message = error_of(await http.get(path, headers=bearer(forger.token())), 401, "unauthorized")
            assert "signature" in message
            unsigned = jwt.encode(
                {"sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "exp": 4_000_000_000}, None, algorithm="none"
            )
            assert "algorithm" in error_of(
                await http.get(path, headers=bearer(unsigned)), 401, "unauthorized"
            )
            hs = hs256_with_public_key(rs.pem())
            error_of(await http.get(path, headers=bearer(hs)), 401, "unauthorized")
            other_audience = rs.token(aud="another-app")
            message = error_of(await http.get(path, headers=bearer(other_audience)), 401, "unauthorized")
            assert "audience" in message
            assert "issuer" in error_of(
                await http.get(path, headers=bearer(rs.token(iss="https://evil.test"))), 401, "unauthorized"
            )
            error_of(await http.get(path, headers=bearer(rs.token(sub=None))), 401, "unauthorized")
            skewed = rs.token(iat=None, nbf=None, exp=int(__import__("time").time()) - 30)
            assert (await http.get(path, headers=bearer(skewed))).status_code == 404  # within the skew

            # ---- unknown thread: 404 on every route
            error_of(await http.get(path, headers=alice), 404, "not_found")
            error_of(await http.get(path + "/events", headers=alice), 404, "not_found")
            approval = {"tool_call_id": "c1", "decision": "approve"}
            error_of(await http.post(path + "/approvals", json=approval, headers=alice), 404, "not_found")

            # ---- bad input (raw bodies declare JSON: another media type is a 415, tested apart)
            as_json = {**alice, "Content-Type": "application/json"}
            error_of(
                await http.post(path + "/messages", content=b"{not json", headers=as_json), 400, "bad_request"
            )
            error_of(await http.post(path + "/messages", json=["hi"], headers=alice), 400, "bad_request")
            error_of(
                await http.post(path + "/messages", json={"txt": "hi"}, headers=alice), 400, "bad_request"
            )
            error_of(
                await http.post(path + "/messages", content='{"text": "\\ud800"}', headers=as_json),
                400,
                "bad_request",
            )
            big = b'{"text": "' + b"x" * MAX_MESSAGE_BYTES + b'"}'
            error_of(await http.post(path + "/messages", content=big, headers=as_json), 413, "too_large")
            error_of(
                await http.post(
                    path + "/messages", json={"text": "hi", "metadata": {"x": "y" * 300_000}}, headers=alice
                ),
                413,
                "too_large",
            )
            error_of(
                await http.post(
                    path + "/messages", json={"text": "hi"}, headers={**alice, "Idempotency-Key": "k" * 600}
                ),
                400,
                "bad_request",
            )
            error_of(await http.delete(path, headers=alice), 405, "method_not_allowed")
            error_of(await http.get("/v2/nothing"), 404, "not_found")

            # ---- a send, retried with the same Idempotency-Key: one message processed
            key = {**alice, "Idempotency-Key": "hello-1"}
            first = await http.post(
                path + "/messages", json={"text": "hello", "metadata": {"app": 1}}, headers=key
            )
            assert first.status_code == 202 and first.json() == {"message_id": "hello-1"}
            again = await http.post(
                path + "/messages", json={"text": "hello", "metadata": {"app": 1}}, headers=key
            )
            assert again.status_code == 202 and again.json() == {"message_id": "hello-1"}
            await api.client.wait(thread, "hello-1", timeout=60)
            history = await http.get(path, headers=alice)
            assert history.status_code == 200
            items = history.json()
            assert items == await api.client.history(thread)
            assert [i["kind"] for i in items] == ["user", "assistant"]
            assert items[1]["text"] == "Hello back, friend."

            # ---- open streams per user are bounded: the third at once is a 429
            async with (
                http.stream("GET", path + "/events?follow=1", headers=alice) as one,
                http.stream("GET", path + "/events?follow=1", headers=alice) as two,
            ):
                assert one.status_code == two.status_code == 200
                # The first bytes of each: the server has started both (iterators kept open, not closed).
                readers = [one.aiter_raw(), two.aiter_raw()]
                for reader in readers:
                    await anext(reader)
                third = await http.get(path + "/events", headers=alice)
                assert "Retry-After" in third.headers
                error_of(third, 429, "too_many_requests")
                for reader in readers:
                    await reader.aclose()

            # ---- another subject: 404 everywhere, and cannot take the thread over
            error_of(await http.get(path, headers=bob), 404, "not_found")
            error_of(await http.get(path + "/events", headers=bob), 404, "not_found")
            error_of(
                await http.post(path + "/messages", json={"text": "mine"}, headers=bob), 404, "not_found"
            )
            error_of(await http.post(path + "/approvals", json=approval, headers=bob), 404, "not_found")
            # ... while a thread made outside the API is nobody's to claim.
            await api.client.send("cli-made-" + thread, "hello")
            error_of(await http.get(f"/v1/threads/cli-made-{thread}", headers=alice), 404, "not_found")

            # ---- approvals: the shape is checked, a valid one is queued for the thread
            for bad in (
                {"tool_call_id": "c1", "decision": "maybe"},
                {"tool_call_id": "c1", "decision": "edit"},
                {"tool_call_id": "c1", "decision": "respond"},
                {"decision": "approve"},
            ):
                error_of(await http.post(path + "/approvals", json=bad, headers=alice), 400, "bad_request")
            sent = await http.post(
                path + "/approvals",
                json={"tool_call_id": "c1", "decision": "edit", "args": {"to": "x"}},
                headers={**alice, "Idempotency-Key": "approval-1"},
            )
            assert sent.status_code == 202 and sent.json() == {"message_id": "approval-1"}

            # ---- the client over HTTP: send, replies (the stream), wait, history — no AWS settings
            async with Client(api_url=api.url, token=rs.token("carol")) as web:
                talk = new_thread("web")
                await web.send(talk, "hello")
                replies = [item async for item in web.replies(talk, timeout=60)]
                assert [(i["kind"], i.get("text")) for i in replies] == [("assistant", "Hello back, friend.")]
                second = await web.send(talk, "hello again")
                await web.wait(talk, second, timeout=60)
                assert [i["kind"] for i in await web.history(talk)] == ["user", "assistant"] * 2
                with pytest.raises(ApiRequestError, match="no thread"):
                    await web.history(thread)  # alice's

            # ---- key rotation: a token signed by a key the JWKS did not have is accepted once it has it
            rotated = ec_key("es-2")
            jwks.keys = [rotated]
            fetches = jwks.fetches
            assert (await http.get(path, headers=bearer(rotated.token("alice")))).status_code == 200
            assert jwks.fetches == fetches + 1
            # a cached key costs no fetch
            assert (await http.get(path, headers=bearer(rotated.token("alice")))).status_code == 200
            assert jwks.fetches == fetches + 1


def test_no_authentication_is_refused_off_loopback() -> None:
    with pytest.raises(ConfigurationError, match="loopback"):
        auth_settings("0.0.0.0", {"STEPAGENT_API_AUTH": "none"})
    assert auth_settings("127.0.0.1", {"STEPAGENT_API_AUTH": "none"}).mode == "none"
    with pytest.raises(ConfigurationError, match="STEPAGENT_JWT_JWKS_URL"):
        auth_settings("0.0.0.0", {})
    with pytest.raises(ConfigurationError, match="STEPAGENT_JWT_AUDIENCE"):
        auth_settings("0.0.0.0", {"STEPAGENT_JWT_JWKS_URL": "https://x", "STEPAGENT_JWT_ISSUER": "i"})


async def test_the_lambda_app_serves_the_page_and_names_a_missing_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import httpx

    from stepagent.api.lambda_app import LambdaApi

    for name in ("STEPAGENT_JWT_JWKS_URL", "STEPAGENT_JWT_PUBLIC_KEY", "STEPAGENT_API_AUTH"):
        monkeypatch.delenv(name, raising=False)
    transport = httpx.ASGITransport(app=LambdaApi())
    async with httpx.AsyncClient(transport=transport, base_url="http://lambda") as http:
        page = await http.get("/")  # the Web Adapter's readiness check
        assert page.status_code == 200 and "stepagent chat" in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        error_of(await http.get("/v1/threads/t"), 500, "configuration")
        monkeypatch.setenv("STEPAGENT_API_AUTH", "none")
        assert "loopback" in error_of(await http.get("/v1/threads/t"), 500, "configuration")
