"""The head's ``inbox`` (DynamoDB): ids of messages another thread has sent, added before the send by
``note_inbound`` and taken out by the commit that processes them, so a reader can tell a quiet thread from
one with mail on the way."""

from __future__ import annotations

from stepagent.history_items import UserItem
from stepagent.messages import TextContent
from stepagent.stores.base import Commit, ThreadKind
from stepagent.stores.dynamodb.io import item_key
from stepagent.stores.dynamodb.layout import HEAD_SK, head_inbox
from tests.conftest import DynamoEnv


async def inbox(env: DynamoEnv, thread: str) -> frozenset[str]:
    response = await env.client.get_item(
        TableName=env.conversation_table, Key=item_key(thread, HEAD_SK), ConsistentRead=True
    )
    return head_inbox(response.get("Item", {}))


async def test_inbound_ids_stay_until_the_commit_that_processes_them(dynamo: DynamoEnv) -> None:
    conversation, state = dynamo.stores()
    await conversation.commit(
        "p", Commit(expected_version=0, rows=[(UserItem(TextContent(text="hi")), "u1")])
    )
    await conversation.spawn_thread("p", child_id="c", spawn_tool_call_id="sp", kind=ThreadKind.CHILD)

    assert await conversation.note_inbound("p", "report-1") is True
    assert await conversation.note_inbound("p", "report-2") is True
    assert await conversation.note_inbound("p", "report-1") is True  # idempotent: a set
    assert await inbox(dynamo, "p") == {"report-1", "report-2"}

    # The commit that records report-1 as processed takes it out, atomically with the rest.
    info = await conversation.commit("p", Commit(expected_version=1, processed_message_ids=["report-1"]))
    assert await inbox(dynamo, "p") == {"report-2"}
    await conversation.commit("p", Commit(expected_version=info.version, processed_message_ids=["report-2"]))
    assert await inbox(dynamo, "p") == frozenset()

    # A re-sent message that was processed already is not noted again (it would never be taken out).
    assert await conversation.note_inbound("p", "report-1") is False
    assert await inbox(dynamo, "p") == frozenset()
    assert await state.filter_processed("p", ["report-1"]) == {"report-1"}


async def test_noting_for_a_thread_without_a_head_creates_nothing(dynamo: DynamoEnv) -> None:
    conversation, _ = dynamo.stores()
    assert await conversation.note_inbound("ghost", "m1") is False
    assert await conversation.get_thread("ghost") is None
