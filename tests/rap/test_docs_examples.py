"""The Python examples in docs/writing-tools.md and examples/rap_server.py run as written."""

from __future__ import annotations

import re
import runpy
from pathlib import Path
from typing import Any

import httpx

from stepagent.rap.protocol import parse_manifest
from stepagent.rap.server import RapToolServer
from stepagent.tools.functions import FunctionTool

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "writing-tools.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def run_block(code: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(code, str(DOC), "exec"), namespace)
    return namespace


async def test_the_function_tool_example() -> None:
    namespace = run_block(blocks()[0])
    convert, fetch_title, word_count = namespace["toolset"]
    assert all(isinstance(t, FunctionTool) for t in namespace["toolset"])
    assert convert(3) == "3.30 USD" and word_count.inline and fetch_title.timeout == 10
    assert await convert.invoke({"amount": 2, "rate": 2}) == "4.00 USD"
    assert convert.parameters["properties"]["amount"]["description"] == "The amount in euros."


async def test_the_rap_server_examples_serve_valid_manifests() -> None:
    doc_server = run_block(blocks()[1])["server"]
    example_server = runpy.run_path(str(ROOT / "examples" / "rap_server.py"), run_name="example")["server"]
    for server in (doc_server, example_server):
        assert isinstance(server, RapToolServer)
        transport = httpx.ASGITransport(app=server.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://tools.test") as client:
            manifest = parse_manifest(
                "http://tools.test", (await client.get("/.well-known/rap-toolset")).json()
            )
        assert {t.name for t in manifest.tools} >= {"forecast", "storm_alerts", "plan_trip"}


def test_the_mcp_server_example_defines_a_server() -> None:
    assert run_block(blocks()[2])["server"] is not None
