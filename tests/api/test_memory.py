"""Memory of idle event streams: 1,000 streams of one conversation held by one ``stepagent api`` process
(a subprocess on the shared moto server, no authentication on loopback), its resident memory per
connection measured and gated — and the same with a trap (each stream keeps a copy of the conversation's
~200 KB history; 200 streams suffice to show it), which must fail the gate, so the gate can tell.

The streams resume from the conversation's end (a token taken here), so they read nothing but their
shared poll; the clients are raw sockets in this process, which is not measured.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

from stepagent.api.events import ResumeTokens, SharedReads, TreeEvents
from stepagent.api.keys import ApiKeys
from stepagent.client.watch import StoreReader
from stepagent.history_items import AssistantText, UserItem
from stepagent.messages import TextContent
from stepagent.stores.base import Commit, UsageRecord
from stepagent.stores.dynamodb.io import DynamoIo
from stepagent.stores.metrics import StoreMetrics
from stepagent.transcript import tree_items
from tests.conftest import REGION, DynamoEnv, moto_endpoint

STREAMS = 1_000
TRAP_STREAMS = 200
WARM_UP = 50
#: Resident memory a connected idle stream may add to the process (uvicorn's connection, the response's
#: task group, the stream's position), in KiB.
GATE_KIB = 64
ROOT = Path(__file__).resolve().parents[2]


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert found
    return int(found.group(1))


#: The servers' callback secret, from which they derive the key that signs resume tokens.
SECRET = "memory-gate-secret"


async def seed(env: DynamoEnv, thread: str) -> str:
    conversation, state = env.stores()
    rows = []
    for i in range(100):
        rows.append((UserItem(TextContent(text=f"question {i} " + "q" * 1000)), f"in-{i}"))
        rows.append((AssistantText(f"answer {i} " + "a" * 1000), f"in-{i}-completion-0"))
    usage = UsageRecord(step_id="in-99", model="test:model", turn_complete=True)
    await conversation.commit(thread, Commit(expected_version=0, rows=rows, usage=usage, turn_complete=True))
    tree = TreeEvents(
        SharedReads(StoreReader(conversation, state, DynamoIo(env.client, None, None, StoreMetrics()))),
        thread,
        tokens=ResumeTokens(ApiKeys.from_secret(SECRET).resume),  # the server's: it has the same secret
    )
    async for _ in tree.poll():
        pass
    return tree.token()


async def open_stream(
    port: int, thread: str, token: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET /v1/threads/{thread}/events?follow=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Last-Event-ID: {token}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"retry: 1000\n\n")  # the stream's first block: it is open
    assert b" 200 " in head.split(b"\r\n", 1)[0], head[:200]
    return reader, writer


async def per_connection_kib(
    env: DynamoEnv, thread: str, token: str, history: Path, trap: bool, streams: int
) -> float:
    code = "import sys; from stepagent.cli import main; sys.exit(main(sys.argv[1:]))"
    if trap:
        code = "import tests.api.memory_trap; " + code
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "STEPAGENT_API_AUTH": "none",
        "STEPAGENT_CALLBACK_SECRET": SECRET,
        "STEPAGENT_CONVERSATION_TABLE": env.conversation_table,
        "STEPAGENT_STATE_TABLE": env.state_table,
        "STEPAGENT_INPUT_QUEUE_URL": f"{moto_endpoint()}/123456789012/unused.fifo",
        "AWS_ENDPOINT_URL": moto_endpoint(),
        "AWS_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "TRAP_HISTORY_FILE": str(history),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, "api", "--port", "0", env=environ, stderr=asyncio.subprocess.PIPE
    )
    connections = []
    try:
        assert process.stderr is not None
        line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)", line).group(1))  # type: ignore[union-attr]
        connections += await asyncio.gather(*(open_stream(port, thread, token) for _ in range(WARM_UP)))
        before = rss_kib(process.pid)
        for start in range(0, streams, 250):
            batch = min(250, streams - start)
            connections += await asyncio.gather(*(open_stream(port, thread, token) for _ in range(batch)))
        after = rss_kib(process.pid)
        assert process.returncode is None
        return (after - before) / streams
    finally:
        for _, writer in connections:
            writer.close()
        process.terminate()
        await process.wait()


async def test_a_thousand_idle_streams_stay_within_the_memory_gate_and_the_trap_does_not(
    dynamo: DynamoEnv, tmp_path: Path
) -> None:
    thread = "memory-gate"
    token = await seed(dynamo, thread)
    conversation, _ = dynamo.stores()
    history = tmp_path / "history.json"
    history.write_text(json.dumps([item async for item in tree_items(conversation, thread)]))
    assert history.stat().st_size > 200_000

    # The two servers run side by side (the trap's excess shows on fewer streams: the figure is per stream).
    normal, trapped = await asyncio.gather(
        per_connection_kib(dynamo, thread, token, history, trap=False, streams=STREAMS),
        per_connection_kib(dynamo, thread, token, history, trap=True, streams=TRAP_STREAMS),
    )
    print(f"resident memory per idle stream: {normal:.1f} KiB (trap: {trapped:.1f} KiB), gate {GATE_KIB} KiB")
    assert normal <= GATE_KIB, f"{normal:.1f} KiB per idle stream, over the {GATE_KIB} KiB gate"
    assert trapped > GATE_KIB, f"the trap ({trapped:.1f} KiB per stream) passed the gate: it cannot tell"
