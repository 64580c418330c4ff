"""Rewind and export/import keep a thread's approval state consistent: a rewind to before a waiting call
drops the wait (and the call can be asked for again); a cut between a call and its decision moves before
the call; an exported thread that waits is imported waiting, and the decision then resumes the copy."""

from __future__ import annotations

from pathlib import Path

from stepagent.history_items import ApprovalItem, approval_states, waiting_for_approval
from stepagent.lifecycle import export_lines, import_tree
from stepagent.lifecycle.rewind import rewind_thread
from stepagent.messages import InputMessage
from tests.engine.harness import Harness, text
from tests.engine.test_approval import harness, mail, provider_mailing


async def waiting_thread(*after: list[object]) -> tuple[Harness, object]:
    tool = mail()
    h = harness(provider_mailing(*after), tool)  # type: ignore[arg-type]
    await h.say("t1", "mail bob", "m1")
    assert waiting_for_approval(await h.history("t1")) is not None
    return h, tool


async def test_a_rewind_to_before_the_waiting_call_drops_the_wait() -> None:
    h, tool = await waiting_thread()
    rows = [row async for row in h.conversation.load_rows("t1")]
    call_order = next(r.order for r in rows if r.item.__class__.__name__ == "ToolCallItem")
    result = await rewind_thread(h.conversation, h.state, "t1", call_order - 1)
    assert result.effective == call_order - 1
    assert waiting_for_approval(await h.history("t1")) is None
    # A late decision for the dropped call changes nothing (the call is gone).
    before = await h.stored("t1")
    await h.send(InputMessage.approval("t1", "tc-1", "approve"), "late")
    await h.run()
    assert await h.stored("t1") == before and tool.dispatches == []


async def test_a_cut_between_a_call_and_its_decision_moves_before_the_call() -> None:
    h, tool = await waiting_thread()
    await h.send(InputMessage.approval("t1", "tc-1", "approve"), "a1")
    await h.run()
    assert tool.dispatches == [("tc-1", {"to": "bob"})]
    rows = [row async for row in h.conversation.load_rows("t1")]
    call_order = next(r.order for r in rows if r.item.__class__.__name__ == "ToolCallItem")
    assert isinstance(rows[-1].item, ApprovalItem)
    result = await rewind_thread(h.conversation, h.state, "t1", call_order)
    # Keeping the call without its decision would ask a person again for a call that already ran.
    assert result.effective == call_order - 1
    assert approval_states(await h.history("t1")) == {}


async def test_export_and_import_keep_the_wait_and_the_copy_resumes_on_a_decision(tmp_path: Path) -> None:
    h, tool = await waiting_thread(text("Sent."))
    path = tmp_path / "tree.jsonl"
    with path.open("w") as out:
        async for line in export_lines(h.conversation, h.state, "t1"):
            out.write(line if line.endswith("\n") else line + "\n")
    await import_tree(h.conversation, h.state, path, new_root="copy")
    copied = await h.history("copy")
    waiting = waiting_for_approval(copied)
    assert waiting is not None and waiting.call.id == "tc-1"
    await h.send(InputMessage.approval("copy", "tc-1", "edit", args={"to": "eve"}), "a-copy")
    await h.run()
    assert tool.dispatches == [("tc-1", {"to": "eve"})]
    assert approval_states(await h.history("copy")) == {"tc-1": "edited"}
    assert approval_states(await h.history("t1")) == {"tc-1": "pending"}  # the original still waits
