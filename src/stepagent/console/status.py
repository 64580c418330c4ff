"""What a conversation is doing, in one word: the console's status rules (pure functions, no I/O).

A thread's status is read from what the stores hold about it (:class:`ThreadFacts`), by the first rule
that applies:

1. **failed** — a dead-lettered message names the thread (input DLQ: its message group; tool DLQ: the
   call's thread), or its newest notice is an ``error`` given up on (``retrying: false``) and nothing
   answered the input since (its last row is an input: user text, a tool result, an event, or it has none).
2. **choice** — a tool asked the user to choose and waits for the answer (a pending choice);
   **approval** — a tool call waits for a person's decision (its thread's last row is that call).
3. closed threads: **working** while a dispatch of theirs is still in flight (the report to the parent),
   else **idle**.
4. **working** — a completion is streaming (for a thread without a head yet: its first one) (its ``LIVE`` partial follows the current head), a message
   from another thread is on its way (the head's ``inbox``), or a committed tool call is not dispatched
   yet (an open intent).
5. **tool** — the thread's last tool call has no result yet and the tool is not passive (a function, MCP
   or RAP tool is running, perhaps for days).
6. **timer** — that call is a passive wait: ``sleep``, ``sleep_until``, ``sleep_until_event_or_input``.
7. **working** — the last commit said the turn is not over (``turn_complete`` false: mid-step, held
   inputs, compaction due), or the thread has never committed (a child before its seed is processed).
8. **idle** — otherwise (active subscriptions do not make a thread busy: events wake it when they come).

A conversation (thread tree) takes the most urgent status of its threads, in the order
failed > choice > approval > working > tool > timer > idle, with the detail of the thread that gave it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypedDict

from stepagent.notices import ErrorEvent, UnknownNotice
from stepagent.stores.base import ThreadInfo
from stepagent.stores.dynamodb.live import LiveState
from stepagent.tools.sleep import Sleep, SleepUntil
from stepagent.tools.subscriptions import SleepUntilEventOrInput
from stepagent.transcript import Item

#: Passive waits: the thread sleeps, nothing runs, the call's "result" is the wake-up.
TIMER_TOOLS = frozenset({Sleep.name, SleepUntil.name, SleepUntilEventOrInput.name})
#: Row kinds that are inputs to the model (a turn that ends on one was never answered).
INPUT_KINDS = frozenset({"user", "tool_result", "event"})


class Status(StrEnum):
    """What a thread or a conversation is doing; ``urgency`` 0 is the most urgent."""

    FAILED = "failed"
    CHOICE = "choice"
    APPROVAL = "approval"
    WORKING = "working"
    TOOL = "tool"
    TIMER = "timer"
    IDLE = "idle"

    @property
    def label(self) -> str:
        return _LABELS[self]

    @property
    def urgency(self) -> int:
        return _URGENCY.index(self)


_URGENCY = (
    Status.FAILED,
    Status.CHOICE,
    Status.APPROVAL,
    Status.WORKING,
    Status.TOOL,
    Status.TIMER,
    Status.IDLE,
)
_LABELS = {
    Status.FAILED: "failed",
    Status.CHOICE: "waiting on a choice",
    Status.APPROVAL: "waiting for approval",
    Status.WORKING: "working",
    Status.TOOL: "waiting on a tool",
    Status.TIMER: "waiting on a timer",
    Status.IDLE: "idle",
}


@dataclass(frozen=True, slots=True)
class ThreadFacts:
    """What the stores say about one thread (gathered by :mod:`stepagent.console.reads`)."""

    thread_id: str
    info: ThreadInfo | None
    inbox: frozenset[str] = frozenset()
    live: LiveState = field(default_factory=LiveState)
    open_intents: int = 0
    choices: int = 0
    subscriptions: int = 0
    held_inputs: int = 0
    #: ``(tool name, tool call id)`` of the last tool call without a result, if any.
    pending_call: tuple[str, str] | None = None
    last_row_kind: str | None = None
    dead_letters: int = 0
    #: The tool name of the call that waits for a person's decision, if any.
    approval: str | None = None


class StatusJson(TypedDict):
    """A status in the console's JSON API."""

    status: str
    label: str
    detail: str
    thread_id: str


@dataclass(frozen=True, slots=True)
class StatusReport:
    """A status with its detail, and the thread it was read from."""

    status: Status
    detail: str
    thread_id: str

    @property
    def label(self) -> str:
        return self.status.label

    def as_dict(self) -> StatusJson:
        return {
            "status": self.status.value,
            "label": self.label,
            "detail": self.detail,
            "thread_id": self.thread_id,
        }


def given_up_error(live: LiveState) -> ErrorEvent | None:
    """The thread's newest notice if it is an ``error`` given up on."""
    last = live.notices[-1] if live.notices else None
    if last is None or isinstance(last, UnknownNotice) or last["type"] != "error" or last["retrying"]:
        return None
    return last


def thread_status(facts: ThreadFacts) -> StatusReport:
    """The status of one thread, by the rules of the module docstring (first rule that applies wins)."""
    detail = _attention(facts) or _lifecycle(facts) or _activity(facts)
    if detail is None:
        detail = (Status.IDLE, f"{facts.subscriptions} active subscription(s)" if facts.subscriptions else "")
    return StatusReport(detail[0], detail[1], facts.thread_id)


def _attention(facts: ThreadFacts) -> tuple[Status, str] | None:
    """Failed, or a question for the user: what needs a person first."""
    if facts.dead_letters:
        return Status.FAILED, f"{facts.dead_letters} dead-lettered message(s)"
    error = given_up_error(facts.live)
    if error is not None and (facts.last_row_kind is None or facts.last_row_kind in INPUT_KINDS):
        return Status.FAILED, error["message"]
    if facts.choices:
        return Status.CHOICE, f"{facts.choices} question(s) to answer"
    if facts.approval is not None and facts.info is not None and not facts.info.closed:
        return Status.APPROVAL, f"{facts.approval} waits for your decision"
    return None


def _lifecycle(facts: ThreadFacts) -> tuple[Status, str] | None:
    """A thread not created yet, or closed."""
    info = facts.info
    if info is None:  # no commit yet: working only while its first completion streams
        if facts.live.phase is not None:
            return Status.WORKING, facts.live.phase
        return Status.IDLE, "not created yet"
    if info.closed:
        if facts.open_intents:
            return Status.WORKING, "closing (a dispatch is in flight)"
        return Status.IDLE, "closed"
    return None


def _activity(facts: ThreadFacts) -> tuple[Status, str] | None:
    """Working (streaming, messages on the way, dispatching, a step in progress), or waiting on a call."""
    info = facts.info
    assert info is not None  # _lifecycle handled a thread without a record
    streaming = facts.live.partial_after(info.version) or (info.version == 0 and facts.live.phase is not None)
    if streaming:
        phase = facts.live.phase or "working"
        return Status.WORKING, f"{phase} {facts.live.tool}" if facts.live.tool else phase
    if facts.inbox:
        return Status.WORKING, f"{len(facts.inbox)} message(s) from other threads on the way"
    if facts.open_intents:
        return Status.WORKING, "dispatching a tool call"
    if facts.pending_call is not None:
        name, _ = facts.pending_call
        return (Status.TIMER if name in TIMER_TOOLS else Status.TOOL), name
    if info.turn_complete is False:
        held = f", {facts.held_inputs} held input(s)" if facts.held_inputs else ""
        return Status.WORKING, "step in progress" + held
    if info.turn_complete is None and info.tail == 0:
        return Status.WORKING, "starting"
    return None


def tree_status(reports: Iterable[StatusReport]) -> StatusReport:
    """The most urgent status of a thread tree's threads (see the module docstring)."""
    ordered = sorted(reports, key=lambda r: r.status.urgency)
    if not ordered:
        return StatusReport(Status.IDLE, "no threads", "")
    return ordered[0]


def pending_call(rows: Iterable[Item]) -> tuple[str, str] | None:
    """The last tool call of ``rows`` (transcript items, in order) that no later result answers."""
    open_calls: dict[str, str] = {}
    for item in rows:
        if item.get("kind") == "tool_call":
            open_calls[str(item["tool_call_id"])] = str(item["name"])
        elif item.get("kind") == "tool_result":
            open_calls.pop(str(item.get("tool_call_id")), None)
    if not open_calls:
        return None
    call_id, name = list(open_calls.items())[-1]
    return name, call_id
