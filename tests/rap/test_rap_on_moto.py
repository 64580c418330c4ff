"""RAP on the AWS runtime (moto server): the worker dispatches a RAP call to the demo tool server on
loopback, the tool's callback goes through the receiver Lambda's code onto the SQS input queue, and the
worker folds the result in. Also the Lambda handler module itself, fed Function URL events."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from stepagent.aws import rap_receiver
from stepagent.aws.rap_receiver import RapReceiverRuntime
from stepagent.aws.settings import Settings
from stepagent.devstack.rap_demo_server import build_server
from stepagent.messages import parse_input_message
from stepagent.rap.server import serve_in_background
from stepagent.rap.tokens import callback_token
from stepagent.senders.sqs import dedup_key
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.rap import CallbackConfig, RapNotifier, load_rap_tools, owner_key
from stepagent.tools.rap_http import RapHttp, RapServerConfig
from tests.conftest import moto_endpoint
from tests.integration.aws_helpers import Stack, aws_stack

SECRET = "moto-secret"
SCRIPT: dict[str, Any] = {
    "rules": [
        {
            "when": "time",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "get_time", "arguments": {"timezone": "UTC"}}}],
        },
        {"when": "UTC$", "on": ["tool_result"], "reply": [{"text": "The time is known."}]},
    ],
    "default": [{"text": "ok"}],
}


def function_url_event(request: Request, body: bytes) -> dict[str, Any]:
    """What a Lambda Function URL hands the function for ``request`` (payload format 2.0, base64 body)."""
    return {
        "version": "2.0",
        "rawPath": request.url.path,
        "rawQueryString": request.url.query,
        "queryStringParameters": dict(request.query_params) or None,
        "headers": dict(request.headers),
        "requestContext": {"http": {"method": request.method, "path": request.url.path}},
        "body": base64.b64encode(body).decode(),
        "isBase64Encoded": True,
    }


def function_url(runtime: RapReceiverRuntime) -> Starlette:
    """A loopback stand-in for the Function URL in front of the receiver Lambda."""

    async def endpoint(request: Request) -> Response:
        result = await runtime.handle(function_url_event(request, await request.body()))
        return Response(result["body"], status_code=result["statusCode"], headers=result["headers"])

    return Starlette(routes=[Route("/", endpoint, methods=["GET", "POST"])])


@asynccontextmanager
async def rap_on_moto() -> AsyncIterator[tuple[Stack, str, Any]]:
    demo = build_server()
    async with httpx.AsyncClient() as http, serve_in_background(demo.app) as tools_url:
        # The receiver's URL is only known once it listens; its runtime needs the stack's queues. So the
        # stack is built first with a placeholder callback, which the loaded tools then get.
        callbacks = CallbackConfig(secret=SECRET)
        rap_http = RapHttp(http)
        loaded = await load_rap_tools(
            [RapServerConfig(tools_url)], rap_http, None, callbacks, existing=builtin_tools()
        )
        assert not loaded.errors
        async with aws_stack(script=SCRIPT, tools=loaded.tools) as stack:
            settings = Settings.from_env(
                {
                    "STEPAGENT_INPUT_QUEUE_URL": stack.input_url,
                    "STEPAGENT_OUTPUT_QUEUE_URL": stack.resources.output_queue_url,
                    "STEPAGENT_CONVERSATION_TABLE": str(stack.settings.conversation_table),
                    "STEPAGENT_STATE_TABLE": str(stack.settings.state_table),
                    "STEPAGENT_BLOB_BUCKET": stack.resources.bucket,
                    "STEPAGENT_CALLBACK_SECRET": SECRET,
                    "AWS_ENDPOINT_URL": moto_endpoint(),
                    "AWS_REGION": "us-east-1",
                }
            )
            receiver = await RapReceiverRuntime.create(settings)
            try:
                async with serve_in_background(function_url(receiver)) as receiver_url:
                    for tool in loaded.tools:
                        tool.callbacks = CallbackConfig(receiver_url, SECRET)
                    stack.runtime.system.config.notifier = RapNotifier(
                        [RapServerConfig(tools_url)], rap_http, stack.runtime.state
                    )
                    yield stack, receiver_url, demo
            finally:
                await receiver.aclose()


async def test_a_rap_call_round_trips_through_the_receiver_lambda_and_sqs() -> None:
    async with rap_on_moto() as (stack, _, _demo):
        await stack.send_user("conv-rap", "what time is it?", "m1")
        async with asyncio.timeout(10):
            while len(await stack.texts("conv-rap")) < 4:  # the callback arrives while (or after) pumping
                await stack.pump()
                await asyncio.sleep(0.02)
        texts = await stack.texts("conv-rap")
        assert texts[:2] == ["what time is it?", 'get_time({"timezone": "UTC"})']
        assert texts[2].endswith("UTC") and texts[3] == "The time is known."
        records = [r for url, event, _ in stack.handled if url == stack.input_url for r in event["Records"]]
        [result] = [r for r in records if '"toolresult"' in r["body"]]
        message = parse_input_message(result["body"])
        call_id = message.content.id  # type: ignore[union-attr]
        assert message.id == f"rap-tool-result-{call_id}" and message.group_id == "conv-rap"
        assert result["attributes"]["MessageGroupId"] == "conv-rap"
        assert result["attributes"]["MessageDeduplicationId"] == dedup_key("conv-rap", message.id)
        owner = await stack.runtime.state.cache_get(owner_key("conv-rap", call_id))
        assert owner is not None and owner.startswith("http://127.0.0.1:")


async def test_the_receiver_refuses_forged_callbacks_and_publishes_view_updates() -> None:
    async with rap_on_moto() as (stack, receiver_url, _demo):
        await stack.send_user("conv-view", "hello", "m1")
        await stack.pump()
        await stack.outputs()
        async with httpx.AsyncClient() as http:
            forged = {"type": "tool_result", "group_id": "conv-view", "id": "call-x", "text": "forged"}
            other = callback_token(SECRET, "someone-else", "call-x")
            assert (await http.post(f"{receiver_url}/?token={other}", json=forged)).status_code == 403
            assert (await http.post(f"{receiver_url}/", json=forged)).status_code == 401
            view = {
                "type": "view_update",
                "group_id": "conv-view",
                "view_type": "progress",
                "content": {"pct": 5},
            }
            token = callback_token(SECRET, "conv-view", "any")
            assert (await http.post(f"{receiver_url}/?token={token}", json=view)).status_code == 200
            unknown = {**view, "group_id": "never-seen"}
            token = callback_token(SECRET, "never-seen", "any")
            assert (await http.post(f"{receiver_url}/?token={token}", json=unknown)).status_code == 404
        assert await stack.receive(stack.input_url) == []
        [event] = await stack.outputs()
        assert event["type"] == "view_update" and event["content"] == {"pct": 5}
        assert event["thread_id"] == event["root_thread_id"] == "conv-view" and event["metadata"] == {}


async def test_the_lambda_handler_module(monkeypatch: pytest.MonkeyPatch) -> None:
    async with aws_stack() as stack:
        for name, value in {
            "STEPAGENT_INPUT_QUEUE_URL": stack.input_url,
            "STEPAGENT_STATE_TABLE": str(stack.settings.state_table),
            "STEPAGENT_CALLBACK_SECRET": SECRET,
            "STEPAGENT_BLOB_BUCKET": stack.resources.bucket,
            "AWS_ENDPOINT_URL": moto_endpoint(),
        }.items():
            monkeypatch.setenv(name, value)
        from handlers.rap_receiver import handler

        body = json.dumps({"type": "tool_result", "group_id": "conv-h", "id": "call-1", "text": "42"})
        event = {
            "requestContext": {"http": {"method": "POST"}},
            "queryStringParameters": {"token": callback_token(SECRET, "conv-h", "call-1")},
            "body": body,
            "isBase64Encoded": False,
        }
        bad = {**event, "queryStringParameters": {"token": "v1.x.y"}}

        def invoke() -> list[dict[str, Any]]:
            try:
                return [handler(event, None), handler(bad, None)]
            finally:
                rap_receiver.reset()

        ok, refused = await asyncio.to_thread(invoke)
        assert ok["statusCode"] == 200 and json.loads(ok["body"]) == {"ok": True}
        assert refused["statusCode"] == 403 and "error" in json.loads(refused["body"])
        [queued] = await stack.receive(stack.input_url)
        assert parse_input_message(queued["Body"]).content.first_text() == "42"  # type: ignore[union-attr]


async def test_a_genuine_callback_the_worker_would_reject_is_a_4xx_and_nothing_is_enqueued() -> None:
    """A lone surrogate in the text (valid JSON, not encodable as UTF-8) used to be a 500 — the tool server
    retries that forever — and a 50,000-deep body made the handler raise (a 502 from Lambda)."""
    async with aws_stack() as stack:
        settings = Settings.from_env(
            {
                "STEPAGENT_INPUT_QUEUE_URL": stack.input_url,
                "STEPAGENT_STATE_TABLE": str(stack.settings.state_table),
                "STEPAGENT_CALLBACK_SECRET": SECRET,
                "STEPAGENT_BLOB_BUCKET": stack.resources.bucket,
                "AWS_ENDPOINT_URL": moto_endpoint(),
                "AWS_REGION": "us-east-1",
            }
        )
        receiver = await RapReceiverRuntime.create(settings)

        def request(body: str, call: str = "call-1") -> dict[str, Any]:
            return {
                "requestContext": {"http": {"method": "POST"}},
                "queryStringParameters": {"token": callback_token(SECRET, "conv-bad", call)},
                "body": body,
                "isBase64Encoded": False,
            }

        try:
            surrogate = '{"type":"tool_result","group_id":"conv-bad","id":"call-1","text":"bad \\ud800"}'
            deep = '{"type":"tool_result","group_id":"conv-bad","id":"call-1","text":"x","content":'
            deep += "[" * 50_000 + "]" * 50_000 + "}"
            long_id = json.dumps(
                {"type": "tool_result", "group_id": "conv-bad", "id": "c" * 600, "text": "x"}
            )
            cases = [
                (surrogate, "call-1", "lone surrogate"),
                (deep, "call-1", "nested deeper"),
                (long_id, "c" * 600, "longer than 512 bytes"),  # a DynamoDB key part: never enqueued
            ]
            for body, call, reason in cases:
                response = await receiver.handle(request(body, call))
                assert response["statusCode"] == 400, response
                assert reason in json.loads(response["body"])["error"]
            fine = '{"type":"tool_result","group_id":"conv-bad","id":"call-1","text":"fine \\u00e9"}'
            assert (await receiver.handle(request(fine)))["statusCode"] == 200
        finally:
            await receiver.aclose()
        [queued] = await stack.receive(stack.input_url)  # only the good one
        assert parse_input_message(queued["Body"]).content.first_text() == "fine é"  # type: ignore[union-attr]
