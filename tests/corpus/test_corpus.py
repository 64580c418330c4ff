"""Threads outlive releases, proven against bytes recorded from earlier releases.

Each directory of ``tests/corpus`` is one release's recording (``make corpus``; see
:mod:`tests.corpus.record`): threads left waiting on a queued tool, an approval, a short timer (delay queue),
a long timer (schedule), a child thread, a claim-checked tool result, a compaction in progress, a RAP
call and a pending RAP subscription, as that release stored and queued them (and, for the RAP calls, the
invocations the tool server holds, with the callback tokens that release issued). Today's code must drive every one of them to its end — nothing
dead-lettered, nothing stuck. The export files recorded with them must import.

The safety net is shown to work: ``a format change without its migration`` replays the same corpus with a
deliberately changed row format (the tool call's ``call`` field renamed, no reader for the old name) and
must fail (``xfail(strict=True)``: if it ever passes, the corpus no longer catches such a change).

Rollback: today's messages and stored items, written by today's code, are fed to a reader that knows only
format v1 (the previous release's rules); each thread must continue, or be dead-lettered with a message
naming the version. And data a newer release wrote (format v2) is refused with that message: the queued
message dead-lettered, the stored item left untouched, never misread.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from stepagent import formats, history_items
from stepagent.errors import CallbackRefusedError, StepagentError
from stepagent.lifecycle.importer import import_tree
from stepagent.rap.tokens import verify_token
from stepagent.senders import sqs as sqs_sender
from stepagent.stores.dynamodb import io as dynamodb_io
from tests.corpus import record, replay, scenarios
from tests.corpus.scenarios import COMPACTING, WAITING, WAITING_ON_RAP
from tests.integration.aws_helpers import Stack, aws_stack

pytestmark = pytest.mark.slow

RELEASES = replay.releases()


def load(release: Path, agent: str) -> dict[str, Any]:
    return json.loads((release / f"{agent}.json").read_text())


async def texts(stack: Stack, thread: str) -> list[str]:
    return await stack.texts(thread)


async def assert_all_finished(stack: Stack) -> None:
    for waiting in WAITING:
        said = await texts(stack, waiting.thread)
        assert waiting.ends_with in said, f"{waiting.point}: {waiting.thread} did not finish: {said[-4:]}"
        info = await stack.runtime.conversation.get_thread(waiting.thread)
        assert info is not None and info.turn_complete, f"{waiting.point}: {waiting.thread} still waits"
    assert await replay.dead_letters(stack) == [], "a recorded message was dead-lettered"


def format_change_without_migration(monkeypatch: pytest.MonkeyPatch) -> None:
    """A release that renames a stored tool call's ``call`` to ``invocation_call`` and forgot to read the
    old name: new rows round-trip, every recorded row holding a tool call is unreadable."""
    to_dict, from_dict = history_items.item_to_dict, history_items.item_from_dict

    def renamed_to_dict(item: history_items.HistoryItem) -> dict[str, Any]:
        out = to_dict(item)
        if out.get("kind") == "tool_call":
            out["invocation_call"] = out.pop("call")
        return out

    def renamed_from_dict(raw: dict[str, Any]) -> history_items.HistoryItem:
        if raw.get("kind") == "tool_call":
            raw = {**raw, "call": raw.get("invocation_call")}  # no migration: the old "call" is dropped
        return from_dict(raw)

    monkeypatch.setattr(history_items, "item_to_dict", renamed_to_dict)
    monkeypatch.setattr(history_items, "item_from_dict", renamed_from_dict)


CHANGES = [
    pytest.param(False, id="as-released"),
    pytest.param(
        True,
        id="a-format-change-without-its-migration",
        marks=pytest.mark.xfail(
            strict=True, raises=(AssertionError, StepagentError), reason="the corpus catches it"
        ),
    ),
]


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("release", RELEASES, ids=[r.name for r in RELEASES])
async def test_every_recorded_thread_runs_to_its_end(
    release: Path, change: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = load(release, "main")
    if change:
        format_change_without_migration(monkeypatch)
    async with replay.loaded(recorded) as stack:
        await replay.continue_threads(stack, [w.thread for w in WAITING])
        await assert_all_finished(stack)


@pytest.mark.parametrize("release", RELEASES, ids=[r.name for r in RELEASES])
async def test_a_recorded_compaction_in_progress_completes(release: Path) -> None:
    recorded = load(release, "compaction")
    assert any(i["sk"]["S"] == "COMPACTION" for i in recorded["tables"]["state"]), "not mid-compaction"
    async with replay.loaded(recorded) as stack:
        await replay.continue_threads(stack, [COMPACTING.thread])
        state = await record.scan(stack, stack.settings.state_table)
        assert not [i for i in state if i["sk"]["S"] == "COMPACTION"], "the compaction never finished"
        conversation = await record.scan(stack, stack.settings.conversation_table)
        assert any(i["sk"]["S"].startswith("S#") for i in conversation), "no summary was applied"
        assert COMPACTING.ends_with in " ".join(await texts(stack, COMPACTING.thread))
        assert await replay.dead_letters(stack) == []


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("release", RELEASES, ids=[r.name for r in RELEASES])
async def test_recorded_rap_calls_and_subscriptions_run_to_their_end(
    release: Path, change: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = load(release, "rap")
    if change:
        format_change_without_migration(monkeypatch)
    async with replay.loaded_with_rap(recorded) as (stack, rap):
        await replay.answer_rap_calls(rap, recorded)
        await replay.continue_threads(stack, [w.thread for w in WAITING_ON_RAP])
        for waiting in WAITING_ON_RAP:
            said = await texts(stack, waiting.thread)
            assert waiting.ends_with in said, f"{waiting.point}: {waiting.thread} did not finish: {said[-4:]}"
            info = await stack.runtime.conversation.get_thread(waiting.thread)
            assert info is not None and info.turn_complete, f"{waiting.point}: {waiting.thread} still waits"
        subscribing = WAITING_ON_RAP[1].thread
        assert await stack.runtime.state.active_subscriptions(subscribing) == set(), "final did not end it"
        assert await replay.dead_letters(stack) == []
        # Each call is answered once: the tool server resending its callback is refused, nothing enqueued.
        for invocation in recorded["rap_calls"].values():
            if invocation["operation"] == "fetch_report":
                with pytest.raises(CallbackRefusedError, match="409"):
                    await rap.answer(invocation)
        assert await stack.receive(stack.input_url) == []


@pytest.mark.parametrize("release", RELEASES, ids=[r.name for r in RELEASES])
async def test_recorded_exports_import_and_continue(release: Path, tmp_path: Path) -> None:
    recorded = load(release, "main")
    assert recorded["exports"], "the recording has no export files"
    async with aws_stack(script=replay.SCRIPT, env=replay.AGENT_ENV) as stack:
        for thread, text in recorded["exports"].items():
            path = tmp_path / f"{thread}.jsonl"
            path.write_text(text)
            await import_tree(
                stack.runtime.conversation, stack.runtime.state, path, new_root=f"{thread}-copy"
            )
            rows = await stack.texts(f"{thread}-copy")
            assert rows, f"the export of {thread} imported no rows"


def test_the_corpus_covers_every_waiting_point() -> None:
    assert RELEASES, "no recorded release in tests/corpus"
    for release in RELEASES:
        main = load(release, "main")
        threads = {item["pk"]["S"] for item in main["tables"]["conversation"]}
        assert {w.thread for w in WAITING} <= threads
        queues = main["queues"]
        assert queues["tool"] and queues["delay"] and main["schedules"] and main["blobs"]
        assert any('"stepagent_claim_check"' in m["body"] for m in queues["input"])
        assert {"corpus-tool", "corpus-parent"} <= set(main["exports"])
        rap = load(release, "rap")
        threads = {item["pk"]["S"] for item in rap["tables"]["conversation"]}
        assert {w.thread for w in WAITING_ON_RAP} <= threads
        held = {i["group_id"]: i for i in rap["rap_calls"].values()}
        assert set(held) == {w.thread for w in WAITING_ON_RAP}, "a RAP call the tool server does not hold"
        for thread, invocation in held.items():  # each holds a callback token its release issued
            token = parse_qs(urlsplit(invocation["callback_url"]).query)["token"][0]
            assert verify_token(scenarios.RAP_SECRET, thread, token) is not None, f"{thread}: bad token"
        subscription = held[WAITING_ON_RAP[1].thread]
        state_keys = {(i["pk"]["S"], i["sk"]["S"]) for i in rap["tables"]["state"]}
        assert (subscription["group_id"], f"SUB#{subscription['id']}") in state_keys, (
            "no pending subscription"
        )


# ---- rollback ------------------------------------------------------------------------------------------


@contextmanager
def writing_format(monkeypatch: pytest.MonkeyPatch, version: int) -> Iterator[None]:
    """Today's code writing format ``version`` (what a release with that format would write) from here on."""
    monkeypatch.setattr(dynamodb_io, "FORMAT_VERSION", version)
    monkeypatch.setattr(sqs_sender, "FORMAT_ATTRIBUTES", {sqs_sender.FORMAT_ATTRIBUTE: str(version)})
    yield


async def test_a_rollback_continues_todays_threads_or_dead_letters_them_naming_the_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Today's code leaves the threads at every point, as the recorder does; a reader that knows only v1
    # (the rules of the release before versions) then picks them up.
    async with aws_stack(script=replay.SCRIPT, env=replay.AGENT_ENV) as writer:
        todays = {"agent": "main", **await record.record_main(writer)}
    monkeypatch.setattr(formats, "READS_UP_TO", 1)
    async with replay.loaded(todays) as stack:
        await replay.continue_threads(stack, [w.thread for w in WAITING])
        dead = await replay.dead_letters(stack)
        named = [
            m
            for m in dead
            if "format v" in m.get("MessageAttributes", {}).get("stepagent_error", {}).get("StringValue", "")
        ]
        assert len(named) == len(dead), "a message was dead-lettered without naming its format version"
        for waiting in WAITING:
            finished = waiting.ends_with in await texts(stack, waiting.thread)
            refused = any(m.get("Attributes", {}).get("MessageGroupId") == waiting.thread for m in named)
            assert finished or refused, f"{waiting.point}: neither continued nor dead-lettered"


async def test_data_of_a_newer_format_is_dead_lettered_naming_the_version_and_left_untouched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with aws_stack(script=replay.SCRIPT, env=replay.AGENT_ENV) as stack:
        # A newer release (format v2, reading v2) starts a thread and leaves it waiting on its tool...
        monkeypatch.setattr(formats, "READS_UP_TO", 2)
        with writing_format(monkeypatch, 2):
            await stack.send_user("newer", "look up the tides", "newer-1")
            await record.pump_queue(stack, "input")
        stored = await record.scan(stack, stack.settings.conversation_table)
        assert stored and all(item["v"] == {"N": "2"} for item in stored)
        # ...then it is rolled back: this release reads up to v1. The tool runner refuses the v2 call, a
        # v1 message to that thread is refused for the v2 head; both dead-lettered, naming the version.
        monkeypatch.setattr(formats, "READS_UP_TO", 1)
        with writing_format(monkeypatch, 1):
            await stack.send_user("newer", "are you there?", "newer-2")
        await stack.send_raw(
            json.dumps({"content": {"type": "text", "text": "hi"}, "group_id": "fresh"}), "fresh", "fresh-1"
        )
        await stack.sqs.send_message(
            QueueUrl=stack.input_url,
            MessageBody=json.dumps({"content": {"type": "text", "text": "from v3"}, "group_id": "fresh"}),
            MessageGroupId="fresh",
            MessageDeduplicationId="fresh-2",
            MessageAttributes={"stepagent_format": {"DataType": "String", "StringValue": "3"}},
        )
        for _ in range(3):
            await record.pump_queue(stack, "input")
        dead = await stack.receive(stack.resources.input_dlq_url, 10)
        reasons = {
            m["Attributes"]["MessageGroupId"]: m["MessageAttributes"]["stepagent_error"]["StringValue"]
            for m in dead
        }
        assert "written by a newer stepagent (format v3; this release reads up to v1)" in reasons["fresh"]
        assert "written by a newer stepagent (format v2; this release reads up to v1)" in reasons["newer"]
        assert len(dead) == 2  # each copied once by the worker, with its reason, and acknowledged
        # The copy keeps the label: redriven once the newer release is back, it is read as v3 again.
        [v3] = [m for m in dead if m["Attributes"]["MessageGroupId"] == "fresh"]
        assert v3["MessageAttributes"]["stepagent_format"]["StringValue"] == "3"
        errors = [e for e in await stack.outputs() if e["type"] == "error" and e["thread_id"] == "newer"]
        assert errors and "format v2" in errors[-1]["message"] and errors[-1]["retrying"] is False
        assert await stack.texts("fresh") == ["hi", "ok"]  # the same thread's v1 message went on
        after = [
            i for i in await record.scan(stack, stack.settings.conversation_table) if i["pk"]["S"] == "newer"
        ]
        assert after == [i for i in stored if i["pk"]["S"] == "newer"], "the newer thread was changed"
