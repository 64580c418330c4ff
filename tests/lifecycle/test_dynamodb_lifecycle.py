"""Lifecycle on DynamoDB (moto server) with the S3 blob bucket: round trip with a 5 MB tool result, the CLI
commands, restore with generation sweeping, and rewinds (cleanup, debris, a racing second store)."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from stepagent.errors import ConcurrentWriteError
from stepagent.history_items import ToolResultItem
from stepagent.ids import derived_id
from stepagent.lifecycle import import_tree, rewind_thread
from stepagent.lifecycle.commands import register, run_lifecycle_command
from stepagent.stores.base import Rewind, ThreadInfo
from stepagent.stores.dynamodb import DynamoConversationStore
from tests.conftest import DynamoEnv
from tests.lifecycle import BIG, build_tree, commit, export_to, rename, transcript, uid, user

pytestmark = pytest.mark.asyncio


def mapping(ids: dict[str, str], new_root: str) -> dict[str, str]:
    return {ids["root"]: new_root} | {
        v: derived_id("import", new_root, v) for k, v in ids.items() if k != "root"
    }


async def row_keys(env: DynamoEnv, thread: str) -> list[str]:
    response = await env.client.query(
        TableName=env.conversation_table,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :r)",
        ExpressionAttributeValues={":pk": {"S": thread}, ":r": {"S": "R#"}},
        ProjectionExpression="sk",
        ConsistentRead=True,
    )
    return [item["sk"]["S"] for item in response["Items"]]


async def test_round_trip_with_children_a_summary_and_a_5_mb_tool_result(
    dynamo: DynamoEnv, tmp_path: Path
) -> None:
    conv, state = dynamo.stores()
    ids = await build_tree(conv, state, big=True)
    path = await export_to(conv, state, ids["root"], tmp_path / "tree.jsonl")
    assert path.stat().st_size > BIG

    fresh_conv, fresh_state = dynamo.stores()  # another process, as the CLI would be
    result = await import_tree(fresh_conv, fresh_state, path, new_root="copy-" + uid())
    new = mapping(ids, result.root_thread_id)
    copied = await transcript(fresh_conv, result.root_thread_id)
    assert copied == rename(await transcript(conv, ids["root"]), new)
    assert any(item["kind"] == "summary" for item in copied)
    assert {item["thread_id"] for item in copied} == set(new.values())
    big = [row async for row in fresh_conv.load_rows(result.root_thread_id, after=6, up_to=7)]
    assert isinstance(big[0].item, ToolResultItem) and len(big[0].item.result.joined_text()) > BIG
    assert [i.tool_call_id for i in await fresh_state.open_intents(result.root_thread_id)] == ["pending-1"]
    assert await fresh_state.get_metadata(result.root_thread_id) == {"user": "ann", "n": 1}


async def test_restore_replaces_in_place_and_sweeps_the_old_generation(
    dynamo: DynamoEnv, tmp_path: Path
) -> None:
    conv, state = dynamo.stores()
    ids = await build_tree(conv, state)
    before = await transcript(conv, ids["root"])
    path = await export_to(conv, state, ids["root"], tmp_path / "tree.jsonl")
    await commit(conv, ids["root"], (user("later"), "m9"))
    await rewind_thread(conv, state, ids["child"], 1)

    result = await import_tree(conv, state, path, replace_existing=True)
    assert result.replaced == 4
    assert await transcript(conv, ids["root"]) == before
    keys = await row_keys(dynamo, ids["root"])
    assert len(keys) == 13 and all(key.startswith("R#g") for key in keys)  # only the new generation
    assert [i.tool_call_id for i in await state.open_intents(ids["root"])] == ["pending-1"]


async def test_rewind_cleans_up_and_the_next_commit_overwrites_the_debris(dynamo: DynamoEnv) -> None:
    conv, state = dynamo.stores()
    ids = await build_tree(conv, state)
    root = ids["root"]
    outcome = await rewind_thread(conv, state, root, 8)  # inside the subscribe pair (8, 9): moves to 7
    assert outcome.effective == 7 and outcome.dropped_rows == 6
    assert outcome.closed_threads == []  # the event child was already closed
    assert await state.active_subscriptions(root) == set()
    assert await state.open_intents(root) == []
    assert await state.deferred_inputs(root) != []  # the child that sent it is alive: kept
    assert await conv.latest_summary(root) is not None
    info = await conv.get_thread(root)
    assert info is not None and info.tail == 7
    await commit(conv, root, (user("new 8"), "n8"), (user("new 9"), "n9"))
    items = [item for item in await transcript(conv, root) if item["thread_id"] == root]
    assert [item.get("text") for item in items[-2:]] == ["new 8", "new 9"]


class RacingDynamoStore(DynamoConversationStore):
    """A step (through another store instance) commits right before this store's rewind write."""

    other: DynamoConversationStore

    async def rewind(self, thread_id: str, rewind: Rewind) -> ThreadInfo:
        await commit(self.other, thread_id, (user("racing step"), uid("m")))
        return await super().rewind(thread_id, rewind)


async def test_a_rewind_racing_a_step_loses_on_the_head_version(dynamo: DynamoEnv) -> None:
    conv, state = dynamo.stores()
    thread = uid()
    await commit(conv, thread, (user("a"), "m1"), (user("b"), "m2"))
    racing = RacingDynamoStore(
        dynamo.client, conversation_table=dynamo.conversation_table, state_table=dynamo.state_table
    )
    racing.other = conv
    info = await conv.get_thread(thread)
    assert info is not None
    with pytest.raises(ConcurrentWriteError):
        await rewind_thread(racing, state, thread, 1, expected_version=info.version)
    with pytest.raises(ConcurrentWriteError, match="kept changing"):
        await rewind_thread(racing, state, thread, 1, attempts=2)
    after = await conv.get_thread(thread)
    assert after is not None and after.tail == 5  # every racing step landed, no rewind did
    assert (await rewind_thread(conv, state, thread, 1)).dropped_rows == 4


# ---- the CLI commands ------------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="stepagent")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


async def test_cli_export_import_and_rewind(
    settings_env: DynamoEnv,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conv, state = settings_env.stores()
    ids = await build_tree(conv, state)
    out = tmp_path / "tree.jsonl"
    assert await run_lifecycle_command(parse("export", ids["root"], "--output", str(out))) == 0
    assert await run_lifecycle_command(parse("export", ids["root"])) == 0
    assert capsys.readouterr().out == out.read_text()
    assert await run_lifecycle_command(parse("export", "nobody")) == 1

    assert await run_lifecycle_command(parse("import", str(out), "--as", "cli-copy")) == 0
    assert "imported 4 thread(s), 20 row(s) as cli-copy" in capsys.readouterr().out
    assert await transcript(conv, "cli-copy") == rename(
        await transcript(conv, ids["root"]), mapping(ids, "cli-copy")
    )

    stdin: Any = io.TextIOWrapper(io.BytesIO(out.read_bytes()))
    monkeypatch.setattr(sys, "stdin", stdin)
    assert await run_lifecycle_command(parse("import", "-", "--as", "from-stdin")) == 0
    assert "as from-stdin" in capsys.readouterr().out

    assert await run_lifecycle_command(parse("rewind", "cli-copy", "--to", "8")) == 0
    printed = capsys.readouterr().out
    assert "rewound thread cli-copy to order 7 (moved from 8: inside a pair): 6 row(s) dropped" in printed
    assert "1 pending dispatch(es) cancelled" in printed
    assert await run_lifecycle_command(parse("rewind", "cli-copy", "--to", "7")) == 0
    assert "nothing changed" in capsys.readouterr().out
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[-1] == {"type": "end", "threads": 4, "rows": 20}
