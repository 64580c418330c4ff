"""`stepagent run` talks to a real provider when its key is present: an OpenAI-compatible endpoint on
loopback (OPENAI_BASE_URL) stands in for the vendor, and receives a genuine Chat Completions request."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from stepagent.rap.server import serve_in_background
from tests.integration.test_cli import ROOT, clean_env

FIXTURE = Path(__file__).resolve().parents[1] / "providers" / "fixtures" / "openai_text.sse"


async def test_run_uses_the_configured_openai_compatible_model() -> None:
    requests: list[dict[str, Any]] = []

    async def completions(request: Request) -> Response:
        assert request.headers["authorization"] == "Bearer sk-test"
        requests.append(json.loads(await request.body()))
        return Response(FIXTURE.read_bytes(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    async with serve_in_background(app) as base:
        env = clean_env(
            OPENAI_API_KEY="sk-test", OPENAI_BASE_URL=f"{base}/v1", STEPAGENT_MODEL="openai:gpt-4o"
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "stepagent.cli", "run", "--say", "hello",
            cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    assert "model: openai:gpt-4o" in err.decode() and "DEMO" not in err.decode()
    assert "agent > Hello 😀 world\u2028!" in out.decode()
    (request,) = requests
    assert request["model"] == "gpt-4o" and request["stream"] is True
    assert request["messages"][-1] == {"role": "user", "content": "hello"}
    assert {tool["function"]["name"] for tool in request["tools"]} >= {"spawn_thread", "sleep"}
