"""Conversation scenarios for the reliability suite, and the checks every crashed-and-redelivered run must
pass.

A *scenario* is a set of inputs to one or more root threads plus what the finished conversation must
contain. Five scenarios cover every kind of I/O a step does: a function tool round trip through the
runner (``tool``), spawn/report/close of a child (``spawn``), a subscription with associative events (one
deferred behind a pending call) and a non-associative event handled by an event child (``sub``),
automatic compaction by a compaction child (``compact``) and a timer (``timer``); ``mixed`` runs all of
them at once on different root threads so batches span several threads.

The checks (:func:`check_snapshot`) are the durability invariants (``docs/reliability.md`` lists all
ten), stated on the final stored state: no lost input (each scenario's expected rows are all there), no
duplicated row (no call, result, event or input twice), no wedged thread (no open intent, no deferred input, no
held compaction claim, no thread owing the model an answer, no trailing unanswered call except
``close_thread`` in a closed thread); plus, from the recorders, every dispatch of a tool call used one
stable idempotency key and happened only after the call was durable, and every ``(thread, dedup id)``
the runtime sent always carried the same body.

The in-memory world (:class:`MemoryWorld`) is cheap (a run is a few milliseconds), so the suite can afford
thousands of runs; the DynamoDB/SQS-on-moto harness in ``test_crash_matrix.py`` reuses the same
scenarios, recorders and checks through the real worker handler.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from stepagent import texts
from stepagent.core.completion import RetryPolicy
from stepagent.core.elicitation import read_question
from stepagent.core.history import INTERRUPTED_TEXT
from stepagent.core.step import StepConfig, StepInput
from stepagent.history_items import (
    ApprovalItem,
    AssistantText,
    EventItem,
    HistoryItem,
    ToolCallItem,
    ToolResultItem,
    UserItem,
    encode_item,
    waiting_for_approval,
)
from stepagent.messages import (
    InputMessage,
    InputRequired,
    OAuthComplete,
    OAuthRequired,
    SubscriptionEvent,
    TextContent,
    ToolResult,
)
from stepagent.modes.step_mode import AgentSystem
from stepagent.providers.base import ModelInfo, ModelRequest, ToolCallComplete
from stepagent.providers.scripted import ScriptedProvider
from stepagent.providers.window import request_estimate
from stepagent.stores.base import ConversationStore, StateStore, StoredRow, ThreadInfo, ThreadKind
from stepagent.stores.memory import memory_stores
from stepagent.tools.base import Tool, ToolContext, Toolset
from stepagent.tools.builtins import builtin_tools
from stepagent.tools.functions import InProcessFunctionRunner, tool
from stepagent.tools.sleep import InProcessTimers, Sleep
from tests.reliability.faults import (
    CrashPlan,
    FaultPlan,
    Faulty,
    FaultyProvider,
    InjectedCrash,
    MixedFifoQueue,
    SendLog,
    in_invocation,
)

# ---- the agent: script and tools ----------------------------------------------------------------------

COMPACT_TEXTS = [f"note {n}: " + f"{n}-abcdefghij " * 130 for n in range(6)]  # ~1,700 chars each
SUB_EVENTS = [("build failed", True), ("tests passed", True), ("deploy finished", False)]

RULES: list[dict[str, Any]] = [
    # compaction children (first: their instructions also say "You are now INSIDE")
    {
        "when": "INSIDE a compaction thread",
        "reply": [
            {
                "tool_call": {
                    "name": "close_thread",
                    "arguments": {"thread_id": "{thread_id}", "report_to_parent": "SUMMARY"},
                }
            }
        ],
    },
    # tool: a function tool through the runner
    {
        "when": "what time",
        "on": ["user"],
        "reply": [{"tool_call": {"name": "get_time", "arguments": {"zone": "UTC"}}}],
    },
    {"when": "^12:00", "on": ["tool_result"], "reply": [{"text": "It is noon."}]},
    # spawn: child reports, then closes with a final report
    {
        "when": "delegate",
        "on": ["user"],
        "reply": [
            {"text": "Delegating."},
            {
                "tool_call": {
                    "name": "spawn_thread",
                    "arguments": {"instructions": "count", "child_of": "{thread_stack}"},
                }
            },
        ],
    },
    {"when": "successfully spawned", "reply": [{"text": "Spawned a child."}]},
    {
        "when": "You are now INSIDE the thread that",
        "reply": [{"tool_call": {"name": "report_to_parent", "arguments": {"report": "three"}}}],
    },
    {
        "when": "Report sent to parent",
        "reply": [
            {
                "tool_call": {
                    "name": "close_thread",
                    "arguments": {"thread_id": "{thread_id}", "report_to_parent": "done"},
                }
            }
        ],
    },
    {"when": "Report from child thread: three", "reply": [{"text": "Got the report."}]},
    {"when": "has shut down", "reply": [{"text": "Child finished."}]},
    # sub: a subscription; "build failed" starts a call that "tests passed" must wait for (deferral)
    {
        "when": "watch the builds",
        "on": ["user"],
        "reply": [{"tool_call": {"name": "subscribe", "arguments": {"topic": "builds"}}}],
    },
    {"when": "^subscribed to builds", "on": ["tool_result"], "reply": [{"text": "Watching."}]},
    {
        "when": "^build failed",
        "on": ["event"],
        "reply": [{"tool_call": {"name": "get_time", "arguments": {"zone": "CET"}}}],
    },
    {"when": "^13:00", "on": ["tool_result"], "reply": [{"text": "Logged the failure."}]},
    {"when": "^tests passed", "on": ["event"], "reply": [{"text": "Good news."}]},
    {
        "when": "^deploy finished",
        "on": ["tool_result"],
        "reply": [
            {
                "tool_call": {
                    "name": "close_thread",
                    "arguments": {"thread_id": "{thread_id}", "report_to_parent": "deploy ok"},
                }
            }
        ],
    },
    {"when": "deploy ok", "on": ["event"], "reply": [{"text": "Noted."}]},
    # storm: a ticker's events pile up behind a pending call and are all released by its result
    {
        "when": "watch the ticker",
        "on": ["user"],
        "reply": [{"tool_call": {"name": "ticker", "arguments": {}}}],
    },
    {
        "when": "^subscribed to the ticker",
        "on": ["tool_result"],
        "reply": [{"tool_call": {"name": "get_time", "arguments": {"zone": "UTC"}}}],
    },
    {"when": "^tick ", "on": ["event"], "reply": [{"text": "Ticks noted."}]},
    # reused: a model that gives every lookup call the same id; the lookup server answers twice
    {
        "when": "look it up",
        "on": ["user"],
        "reply": [{"tool_call": {"name": "lookup", "arguments": {"key": "k"}}}],
    },
    {"when": "^found$", "on": ["tool_result"], "reply": [{"text": "Found it."}]},
    # timer
    {
        "when": "take a nap",
        "on": ["user"],
        "reply": [{"tool_call": {"name": "sleep", "arguments": {"seconds": 60}}}],
    },
    {"when": "^Slept for", "on": ["tool_result"], "reply": [{"text": "Awake."}]},
    # approval: send_email waits for a person, who edits the recipient; the edited call runs once
    {
        "when": "send the report",
        "on": ["user"],
        "reply": [{"text": "Drafted."}, {"tool_call": {"name": "send_email", "arguments": {"to": "ops"}}}],
    },
    {"when": "^mailed ", "on": ["tool_result"], "reply": [{"text": "Mailed."}]},
    # elicitation: confirm_delete asks the person a question (as a 2026-07-28 MCP server does through the
    # tool runner); the answer re-sends the call with the server's state, which runs once
    {
        "when": "delete the draft",
        "on": ["user"],
        "reply": [{"tool_call": {"name": "confirm_delete", "arguments": {"path": "draft"}}}],
    },
    {"when": "^deleted draft", "on": ["tool_result"], "reply": [{"text": "Deleted."}]},
    # sign-in: my_notes needs the person to sign in to its MCP server first (the tool runner sends
    # oauth_required); the API's callback resumes the call, which runs once
    {
        "when": "show my notes",
        "on": ["user"],
        "reply": [{"tool_call": {"name": "my_notes", "arguments": {}}}],
    },
    {"when": "^notes of alice", "on": ["tool_result"], "reply": [{"text": "Here they are."}]},
]


class Subscribe(Tool):
    """A subscription tool server stand-in: its dispatch acknowledges the subscription and then sends the
    events, each with a dedup id derived from the call id (so a re-dispatch re-sends identical messages)."""

    name = "subscribe"
    description = "Subscribe to build events."
    parameters = {"type": "object", "properties": {"topic": {"type": "string"}}}

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        call = context.tool_call_id
        started = ToolResult.text(call, "subscribed to builds")
        await context.sender.send(
            InputMessage.tool_result(context.thread_id, started, subscription=True), call
        )
        for index, (text, associative) in enumerate(SUB_EVENTS):
            event = InputMessage.tool_result(
                context.thread_id,
                ToolResult.text(call, text),
                synthetic=SubscriptionEvent(tool_call_id=call, associative=associative),
            )
            await context.sender.send(event, f"{call}-event-{index}")


STORM_TICKS = 34  # 3 x 34 + 2 state changes: more than one DynamoDB transaction holds (100 actions)


class Ticker(Tool):
    """A subscription whose start result is followed at once by :data:`STORM_TICKS` associative events:
    the model answers the start with a call, so the events are held behind it, then released together."""

    name = "ticker"
    description = "Subscribe to the ticker."
    parameters = {"type": "object", "properties": {}}

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        call = context.tool_call_id
        started = ToolResult.text(call, "subscribed to the ticker")
        await context.sender.send(
            InputMessage.tool_result(context.thread_id, started, subscription=True), call
        )
        for index in range(STORM_TICKS):
            event = InputMessage.tool_result(
                context.thread_id,
                ToolResult.text(call, f"tick {index}"),
                synthetic=SubscriptionEvent(tool_call_id=call, associative=True),
            )
            await context.sender.send(event, f"{call}-tick-{index}")


class Lookup(Tool):
    """A tool server that answers, then sends a second, late answer for the same call under another id
    (a retrying server): the late one must be absorbed as an answer to an already-answered call."""

    name = "lookup"
    description = "Look a key up."
    parameters = {"type": "object", "properties": {"key": {"type": "string"}}}

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        await context.send_result("found")
        late = ToolResult.text(context.tool_call_id, "found (a late second answer)", call_id=context.call_id)
        await context.sender.send(
            InputMessage.tool_result(context.thread_id, late), f"{context.tool_call_id}-late"
        )


REUSED_CALL_ID = "call_reused"


class ReusedCallIds:
    """Wraps a provider: every ``lookup`` call carries :data:`REUSED_CALL_ID` (OpenAI-compatible servers
    and open models repeat ids); the runtime must give each call a thread-unique id."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @property
    def info(self) -> ModelInfo:
        info: ModelInfo = self.inner.info
        return info

    async def stream(self, request: ModelRequest) -> Any:
        async for event in self.inner.stream(request):
            if isinstance(event, ToolCallComplete) and event.call.name == "lookup":
                event = ToolCallComplete(event.call.model_copy(update={"id": REUSED_CALL_ID}))
            yield event


def make_get_time(runs: list[str]) -> Tool:
    @tool
    async def get_time(zone: str) -> str:
        """The current time in a zone."""
        runs.append(zone)
        return "13:00" if zone == "CET" else "12:00"

    return get_time


def make_send_email(runs: list[str]) -> Tool:
    @tool(approval=True)
    async def send_email(to: str) -> str:
        """Send the report by email (a person approves each call)."""
        runs.append(f"mail:{to}")
        return f"mailed {to}"

    return send_email


#: The scenario's stand-in for a person's decision: sent, once the thread waits, as an ``edit`` of the
#: waiting call (:func:`wave_messages` looks the call up).
DECISION = "<decision: edit to=ops-team>"
EDITED_ARGS = {"to": "ops-team"}


class ConfirmDelete(Tool):
    """What the tool runner does for a 2026-07-28 MCP server whose tool asks a question: the first run
    sends an ``input_required`` notice (the question, the server's opaque state) and no result; the run
    resumed with the person's answer (``context.resume``) sends the real result."""

    name = "confirm_delete"
    description = "Delete a file after asking the person why."
    parameters = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}

    def __init__(self, runs: list[str]) -> None:
        self.runs = runs

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        resume = context.resume
        if resume is None:
            self.runs.append("ask")
            notice = InputRequired(
                id=context.tool_call_id,
                call_id=context.call_id,
                message="Why delete it?",
                requested_schema={"type": "object", "properties": {"reason": {"type": "string"}}},
                key="why",
                request_state="sealed-state-1",
            )
            await context.sender.send(
                InputMessage(content=notice, group_id=context.thread_id), f"{context.tool_call_id}-input-1"
            )
            return
        assert resume["request_state"] == "sealed-state-1" and resume["key"] == "why", resume
        reason = resume["answer"].get("content", {}).get("reason")
        self.runs.append(f"delete:{reason}")
        await context.send_result(f"deleted {arguments['path']} because {reason}")


class MyNotes(Tool):
    """What the tool runner does for an ``"auth": "oauth"`` MCP server: without the person's sign-in the
    run sends ``oauth_required`` and no result; the run the API's callback resumes (its ``oauth_complete``
    carries the marker a stored token stands for here) sends the real result."""

    name = "my_notes"
    description = "The signed-in person's notes."
    parameters = {"type": "object", "properties": {}}

    def __init__(self, runs: list[str]) -> None:
        self.runs = runs

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        resume = context.resume or {}
        if resume.get("signed_in") != "alice":
            self.runs.append("sign-in")
            notice = OAuthRequired(
                id=context.tool_call_id,
                call_id=context.call_id,
                auth_url="https://as.example/authorize?state=s1",
            )
            await context.sender.send(
                InputMessage(content=notice, group_id=context.thread_id), f"{context.tool_call_id}-oauth-1"
            )
            return
        self.runs.append("notes")
        await context.send_result("notes of alice: buy milk")


#: The scenario's stand-in for the person signing in: sent, once the thread waits, as the API's
#: ``oauth_complete`` for the waiting call (:func:`wave_messages` looks the call up).
SIGN_IN = "<sign-in: alice>"


#: The scenario's stand-in for the person's answer: sent, once the thread waits, as an ``elicitation``
#: answer for the waiting call (:func:`wave_messages` looks the call up).
ANSWER = "<answer: accept reason=stale>"


def base_tools(runs: list[str]) -> list[Tool]:
    return [
        make_get_time(runs),
        make_send_email(runs),
        ConfirmDelete(runs),
        MyNotes(runs),
        Subscribe(),
        Ticker(),
        Lookup(),
        Sleep(),
        *builtin_tools(),
    ]


def context_window(tools: Sequence[Tool]) -> int:
    """A window that compacts only the ``compact`` scenario: its compaction limit (75%, measured with the
    runtime's request estimate) sits ~930 estimated tokens (~2,800 characters) above the fixed part of
    every request (system prompt and tool specs), which the small scenarios stay under and two long notes
    pass."""
    system = texts.DEFAULT_SYSTEM_PROMPT + texts.THREAD_SUFFIX.format(root_thread_id="x" * 36)
    fixed = request_estimate(system, Toolset.of(tools).specs(), [])
    return math.ceil((fixed + 933) / 0.75)


def script(window: int) -> dict[str, Any]:
    return {"context_window": window, "rules": RULES, "default": [{"text": "ok"}]}


# ---- scenarios ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    #: (root thread suffix, user text, wave): wave 0 is queued before the run, wave n once the
    #: conversation is idle after wave n-1 (so a thread can compact, then grow again)
    inputs: tuple[tuple[str, str, int], ...]

    def roots(self, prefix: str = "") -> list[str]:
        return list(dict.fromkeys(prefix + root for root, _, _ in self.inputs))

    @property
    def waves(self) -> int:
        return 1 + max(wave for _, _, wave in self.inputs)

    def messages(self, wave: int, prefix: str = "") -> list[tuple[InputMessage, str]]:
        return [
            (InputMessage.user_text(prefix + root, text, id=f"{prefix}user-{n}"), f"{prefix}user-{n}")
            for n, (root, text, at) in enumerate(self.inputs)
            if at == wave
        ]


_BASIC: dict[str, tuple[tuple[str, str, int], ...]] = {
    "tool": (("tool", "what time is it?", 0),),
    "spawn": (("spawn", "please delegate this", 0),),
    "sub": (("sub", "watch the builds", 0),),
    "compact": tuple(("compact", text, n // 2) for n, text in enumerate(COMPACT_TEXTS)),
    "timer": (("timer", "take a nap", 0),),
    "storm": (("storm", "watch the ticker", 0),),
    "reused": (("reused", "look it up", 0), ("reused", "look it up again", 1)),
    "approval": (("approval", "please send the report", 0), ("approval", DECISION, 1)),
    "elicit": (("elicit", "please delete the draft", 0), ("elicit", ANSWER, 1)),
    "signin": (("signin", "show my notes", 0), ("signin", SIGN_IN, 1)),
}
SCENARIOS: dict[str, Scenario] = {name: Scenario(name, inputs) for name, inputs in _BASIC.items()}
# The storm stays out of "mixed": its 40 held events would multiply the I/O points of every mixed run;
# so do the approval and the elicitation (each would add a wave to every mixed run; they have their own rows).
SCENARIOS["mixed"] = Scenario(
    "mixed",
    tuple(
        i
        for name, inputs in _BASIC.items()
        if name not in ("storm", "approval", "elicit", "signin")
        for i in inputs
    ),
)


async def wave_messages(
    scenario: Scenario, wave: int, conversation: ConversationStore, prefix: str = ""
) -> list[tuple[InputMessage, str]]:
    """``scenario.messages``, with each :data:`DECISION` turned into an ``edit`` of the call its thread
    waits on (read from the store, unwrapped: the person looks at the thread before deciding)."""
    out = []
    for message, dedup_id in scenario.messages(wave, prefix):
        content = message.content
        if isinstance(content, TextContent) and content.text == DECISION:
            rows = [row async for row in conversation.load_rows(message.group_id)]
            waiting = waiting_for_approval([row.item for row in rows])
            assert waiting is not None, f"{message.group_id} is not waiting for approval"
            message = InputMessage.approval(
                message.group_id, waiting.call.id, "edit", args=EDITED_ARGS, id=dedup_id
            )
        elif isinstance(content, TextContent) and content.text == ANSWER:
            rows = [row async for row in conversation.load_rows(message.group_id)]
            asking = [r.item for r in rows if isinstance(r.item, ToolCallItem)]
            assert asking and asking[-1].call.name == "confirm_delete", f"{message.group_id} asks nothing"
            message = InputMessage.elicitation(
                message.group_id, asking[-1].call.id, "accept", {"reason": "stale"}, id=dedup_id
            )
        elif isinstance(content, TextContent) and content.text == SIGN_IN:
            rows = [row async for row in conversation.load_rows(message.group_id)]
            waiting = [r.item for r in rows if isinstance(r.item, ToolCallItem)]
            assert waiting and waiting[-1].call.name == "my_notes", f"{message.group_id} waits for no sign-in"
            done = OAuthComplete(
                tool_call_id=waiting[-1].call.id,
                outcome="signed_in",
                server="notes",
                resume={"signed_in": "alice"},
            )
            message = InputMessage(content=done, group_id=message.group_id, id=dedup_id)
        out.append((message, dedup_id))
    return out


# ---- recorders ------------------------------------------------------------------------------------------


@dataclass
class DispatchLog:
    """Every tool dispatch: the idempotency key (the tool call id the tool sees) must always come with the
    same thread, tool and arguments, and the call must already be durable when it is dispatched."""

    signatures: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)
    not_durable: list[str] = field(default_factory=list)
    count: int = 0

    def record(self, thread_id: str, key: str, name: str, arguments: dict[str, Any], durable: bool) -> None:
        self.count += 1
        signature = (thread_id, name, json.dumps(arguments, sort_keys=True))
        if self.signatures.setdefault(key, signature) != signature:
            self.conflicts.append(f"{key}: dispatched as {signature} and {self.signatures[key]}")
        if not durable:
            self.not_durable.append(
                f"{thread_id}/{key} ({name}) dispatched before it (and a decision it waits for) was committed"
            )


IsCommitted = Callable[[str, str], Awaitable[bool]]


class ProbedTool(Tool):
    """Wraps a tool: checks and records each dispatch, with an I/O boundary just before and just after it."""

    def __init__(self, inner: Tool, plan: FaultPlan, log: DispatchLog, is_committed: IsCommitted) -> None:
        self.inner, self.plan, self.log, self.is_committed = inner, plan, log, is_committed
        # Instance attributes shadow the class-level defaults, so the runtime sees the wrapped tool's kind.
        self.name = inner.name  # type: ignore[misc]
        self.description = inner.description  # type: ignore[misc]
        self.parameters = inner.parameters  # type: ignore[misc]
        self.inline = inner.inline  # type: ignore[misc]
        self.passive = inner.passive  # type: ignore[misc]
        self.referenced_later = inner.referenced_later  # type: ignore[misc]
        self.approval = inner.approval  # type: ignore[misc]

    def spec(self) -> Any:
        return self.inner.spec()

    def display(self, arguments: dict[str, Any]) -> str | None:
        return self.inner.display(arguments)

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult | None:
        durable = await self.is_committed(context.thread_id, context.tool_call_id)
        self.log.record(context.thread_id, context.tool_call_id, self.name, arguments, durable)
        self.plan.tick(f"dispatch:before:{self.name}")
        result = await self.inner.execute(arguments, context)
        self.plan.tick(f"dispatch:after:{self.name}")
        return result


def probed(tools: Sequence[Tool], plan: FaultPlan, log: DispatchLog, is_committed: IsCommitted) -> Toolset:
    return Toolset.of(ProbedTool(t, plan, log, is_committed) for t in tools)


async def committed_in(conversation: ConversationStore, thread_id: str, tool_call_id: str) -> bool:
    """Whether ``tool_call_id`` is a committed tool call of ``thread_id`` (read past any fault wrapper) —
    and, for a call that waits for a person, whether the person's decision is committed too (a call is
    never run before its decision)."""
    found = decided = False
    async for row in conversation.load_rows(thread_id):
        if isinstance(row.item, ToolCallItem) and row.item.call.id == tool_call_id:
            found, decided = True, not row.item.needs_approval
        if isinstance(row.item, ApprovalItem) and row.item.tool_call_id == tool_call_id:
            decided = True
    return found and decided


# ---- the in-memory world ------------------------------------------------------------------------------

FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)


@dataclass
class MemoryWorld:
    """One conversation on in-memory stores: the step engine behind fault wrappers (stores, queue, model,
    timers, tool dispatch), a FIFO queue that redelivers whatever an invocation did not acknowledge, and
    a manual timer backend that fires when the queue is idle."""

    scenario: Scenario
    plan: CrashPlan
    queue: MixedFifoQueue
    conversation: ConversationStore
    state: StateStore
    system: AgentSystem
    timers: InProcessTimers
    dispatches: DispatchLog
    tool_runs: list[str]
    failures: list[str] = field(default_factory=list)
    invocations: int = 0


StoreFactory = Callable[[], tuple[Any, Any]]


def memory_world(
    scenario: Scenario, plan: CrashPlan, *, dedupe: bool, stores: StoreFactory = memory_stores
) -> MemoryWorld:
    conversation, state = stores()
    queue = MixedFifoQueue(dedupe=dedupe)
    runs: list[str] = []
    tools = base_tools(runs)
    dispatches = DispatchLog()

    async def is_committed(thread_id: str, tool_call_id: str) -> bool:
        if not await committed_in(conversation, thread_id, tool_call_id):
            return False
        # a call resumed with a person's answer: the answer must be durable (processed) before it runs
        kept = await read_question(state, thread_id, tool_call_id)
        if kept is not None and kept.answered_by is not None:
            return bool(await state.filter_processed(thread_id, [kept.answered_by]))
        return True

    timers = InProcessTimers(queue, clock=lambda: datetime(2026, 1, 1, tzinfo=UTC), manual=True)
    config = StepConfig(
        provider=FaultyProvider(ReusedCallIds(ScriptedProvider(script(context_window(tools)))), plan),
        toolset=probed(tools, plan, dispatches, is_committed),
        sender=Faulty(queue, plan, "queue"),
        timers=Faulty(timers, plan, "timers"),
        runner=InProcessFunctionRunner(tools),
        retry=RetryPolicy(sleep=_no_sleep),
        clock=lambda: 1_000_000.0,  # compaction leases: a fixed clock keeps runs deterministic
    )
    system = AgentSystem(Faulty(conversation, plan, "conversation"), Faulty(state, plan, "state"), config)
    return MemoryWorld(scenario, plan, queue, conversation, state, system, timers, dispatches, runs)


async def _no_sleep(_: float) -> None:
    return None


async def run_memory(
    scenario: Scenario,
    crash_points: frozenset[int] = frozenset(),
    *,
    batch_size: int = 1,
    dedupe: bool = True,
    stores: StoreFactory = memory_stores,
) -> MemoryWorld:
    """Run ``scenario`` to idle, crashing before each I/O call numbered in ``crash_points``."""
    world = memory_world(scenario, CrashPlan(crash_points=crash_points), dedupe=dedupe, stores=stores)
    wave = 0
    for _ in range(500):
        batch = world.queue.receive_any(batch_size)
        if not batch:
            if await world.timers.deliver_due(FAR_FUTURE):
                continue  # time passes only while nothing else is queued
            if wave == scenario.waves:
                return world
            for message, dedup_id in await wave_messages(scenario, wave, world.conversation):
                await world.queue.send(message, dedup_id)
            wave += 1
            continue
        world.invocations += 1
        inputs = [StepInput(r.message, r.message_id) for r in batch]
        try:
            results = await in_invocation(world.invocations, lambda i=inputs: world.system.step(i))
        except InjectedCrash:
            continue  # the invocation died: nothing is acknowledged, the queue redelivers the batch
        failed = {r.thread_id for r in results if not r.ok}
        world.failures += [f"{r.thread_id}: {r.error!r}" for r in results if not r.ok]
        world.queue.ack([r for r in batch if r.message.group_id not in failed])
    raise AssertionError(f"{scenario.name}: the conversation never went idle")


# ---- snapshots and checks -----------------------------------------------------------------------------


@dataclass
class ThreadView:
    info: ThreadInfo
    rows: list[StoredRow]
    intents: list[str]
    deferred: list[str]
    claim_free: bool
    has_summary: bool

    @property
    def items(self) -> list[HistoryItem]:
        return [row.item for row in self.rows]


Snapshot = dict[str, ThreadView]


async def snapshot(conversation: ConversationStore, state: StateStore, roots: Sequence[str]) -> Snapshot:
    """Every thread under ``roots`` (children found through the store's child index), read unwrapped."""
    views: Snapshot = {}
    pending = list(roots)
    while pending:
        thread = pending.pop(0)
        info = await conversation.get_thread(thread)
        if info is None or thread in views:
            continue
        claim_free = await state.claim_compaction(thread, "snapshot-probe", 0.0, 0.0)
        if claim_free:
            await state.release_compaction(thread)
        views[thread] = ThreadView(
            info=info,
            rows=[row async for row in conversation.load_rows(thread)],
            intents=[i.tool_call_id for i in await state.open_intents(thread)],
            deferred=[d.message_id for d in await state.deferred_inputs(thread)],
            claim_free=claim_free,
            has_summary=await conversation.latest_summary(thread) is not None,
        )
        pending += [child.thread_id for child in await conversation.children(thread)]
    return views


def rows_of(snap: Snapshot) -> dict[str, list[tuple[int, str]]]:
    """Byte-level content, ``(order, encoded item)``, of every thread except compaction children (what a
    crash-free run with the same deliveries must reproduce exactly).

    Row ids are compared separately (:func:`row_ids_of`): a completion re-run after a synchronous tool was
    re-driven restarts its row-id counter, so its rows get other ids than in the crash-free run (a known
    weakness, see ``test_crash_matrix.py``).

    Compaction children are left out on purpose: the step sends its compaction request *after* its
    commit and outside the outbox, so a crash between the two delays the request until the input's
    redelivery asks again (the request's id is the same then, so nothing is blocked). Which
    compactions happen may therefore differ from the crash-free run; the compacted thread's own rows do
    not (a summary changes what the model is shown, not what is stored), and :func:`expect_scenario`
    still requires a compaction to have happened."""
    return {
        thread: [(r.order, encode_item(r.item)) for r in view.rows]
        for thread, view in sorted(snap.items())
        if view.info.kind != ThreadKind.COMPACTION
    }


def row_ids_of(snap: Snapshot) -> dict[str, list[str]]:
    """The row ids of every thread except compaction children."""
    return {
        thread: [r.message_id for r in view.rows]
        for thread, view in sorted(snap.items())
        if view.info.kind != ThreadKind.COMPACTION
    }


def _text(item: HistoryItem) -> str:
    if isinstance(item, UserItem):
        return item.text or ""
    if isinstance(item, ToolResultItem | EventItem):
        return item.result.joined_text()
    if isinstance(item, AssistantText):
        return item.text
    return ""


def _duplicates(values: list[Any]) -> list[Any]:
    seen: set[Any] = set()
    return sorted({v for v in values if v in seen or seen.add(v)}, key=repr)  # type: ignore[func-returns-value]


def check_thread(thread: str, view: ThreadView) -> list[str]:
    """The per-thread invariants: nothing duplicated, nothing left half-done. (Row ids are not required to
    be unique here: see :func:`rows_of`.)"""
    problems: list[str] = []
    items = view.items
    duplicates = {
        "user inputs": _duplicates([i.text for i in items if isinstance(i, UserItem)]),
        "tool calls": _duplicates(
            [i.call.id for i in items if isinstance(i, ToolCallItem)]
            + [i.invocation.id for i in items if isinstance(i, EventItem) and i.invocation is not None]
        ),
        "answers": _duplicates([i.result.id for i in items if isinstance(i, ToolResultItem | EventItem)]),
        "events": _duplicates(
            [(i.tool_call_id, i.result.joined_text()) for i in items if isinstance(i, EventItem)]
        ),
        "decisions": _duplicates([i.tool_call_id for i in items if isinstance(i, ApprovalItem)]),
    }
    problems += [f"{thread}: duplicated {what}: {found}" for what, found in duplicates.items() if found]
    if view.intents:
        problems.append(f"{thread}: open dispatch intents {view.intents}")
    if view.deferred:
        problems.append(f"{thread}: deferred inputs never delivered {view.deferred}")
    if not view.claim_free:
        problems.append(f"{thread}: a compaction claim is still held")
    last = items[-1] if items else None
    if isinstance(last, ToolCallItem):
        if not (view.info.closed and last.call.name == "close_thread"):
            problems.append(f"{thread}: wedged on an unanswered {last.call.name} call")
    elif isinstance(last, UserItem | ToolResultItem | EventItem) and not view.info.closed:
        problems.append(f"{thread}: wedged — the model never answered {_text(last)[:60]!r}")
    return problems


def _count(items: list[HistoryItem], kind: type[Any], text: str) -> int:
    return sum(1 for i in items if isinstance(i, kind) and text in _text(i))


def _calls(items: list[HistoryItem], name: str) -> list[ToolCallItem]:
    return [i for i in items if isinstance(i, ToolCallItem) and i.call.name == name]


def _children(snap: Snapshot, parent: str, kind: ThreadKind) -> list[ThreadView]:
    return [v for v in snap.values() if v.info.parent_id == parent and v.info.kind == kind]


def expect_scenario(scenario: Scenario, snap: Snapshot, prefix: str = "") -> list[str]:
    """What the finished conversation must contain: each root's basic scenario, all inputs answered."""
    return [p for root in scenario.roots() for p in _expect_basic(root, snap, prefix)]


def _expect_basic(name: str, snap: Snapshot, prefix: str) -> list[str]:
    root = prefix + name
    if root not in snap:
        return [f"{name}: thread {root} does not exist"]
    view = snap[root]
    items = view.items
    want_users = [text for _, text, _ in _BASIC[name] if text not in (DECISION, ANSWER, SIGN_IN)]
    facts: dict[str, bool] = {
        "every input once, in order": [i.text for i in items if isinstance(i, UserItem)] == want_users,
        "ends with an answer": isinstance(items[-1], AssistantText) if items else False,
    }
    if name == "tool":
        facts["one get_time call"] = len(_calls(items, "get_time")) == 1
        facts["its result once"] = _count(items, ToolResultItem, "12:00") == 1
        facts["the final answer"] = bool(items) and items[-1] == AssistantText("It is noon.")
    elif name == "spawn":
        children = _children(snap, root, ThreadKind.CHILD)
        facts["one child, closed"] = len(children) == 1 and children[0].info.closed
        facts["the child reported once"] = (
            bool(children) and len(_calls(children[0].items, "report_to_parent")) == 1
        )
        facts["report folded in once"] = _count(items, EventItem, "Report from child thread: three") == 1
        facts["closing folded in once"] = _count(items, EventItem, "has shut down") == 1
    elif name == "sub":
        event_children = _children(snap, root, ThreadKind.SUBSCRIPTION_EVENT)
        child_items = event_children[0].items if event_children else []
        facts["subscribed once"] = _count(items, ToolResultItem, "subscribed to builds") == 1
        facts["associative events inlined once each"] = all(
            _count(items, EventItem, text) == 1 for text, assoc in SUB_EVENTS if assoc
        )
        # "tests passed" may arrive while get_time is pending: it must wait for the result (deferral),
        # never interrupt the call. (With both events in one batch the model answers them at once and
        # never calls get_time.)
        calls = len(_calls(items, "get_time"))
        facts["get_time answered by its result"] = (
            calls <= 1 and _count(items, ToolResultItem, "13:00") == calls
        )
        facts["no call interrupted"] = _count(items, ToolResultItem, INTERRUPTED_TEXT) == 0
        facts["one event child, closed"] = len(event_children) == 1 and event_children[0].info.closed
        facts["the event child saw its event once"] = (
            _count(child_items, ToolResultItem, "deploy finished") == 1
        )
        facts["its report folded in once"] = _count(items, EventItem, "deploy ok") == 1
    elif name == "compact":
        compactions = _children(snap, root, ThreadKind.COMPACTION)
        facts["compacted at least once"] = bool(compactions) and view.has_summary
        facts["every compaction child closed"] = all(c.info.closed for c in compactions)
    elif name == "storm":
        ticks = [_text(i) for i in items if isinstance(i, EventItem) and _text(i).startswith("tick ")]
        facts["every tick once, in order"] = ticks == [f"tick {n}" for n in range(STORM_TICKS)]
        calls = len(_calls(items, "get_time"))
        facts["get_time answered by its result"] = (
            calls <= 1 and _count(items, ToolResultItem, "12:00") == calls
        )
        facts["no call interrupted"] = _count(items, ToolResultItem, INTERRUPTED_TEXT) == 0
    elif name == "reused":
        lookups = _calls(items, "lookup")
        facts["two lookup calls with distinct ids"] = len({c.call.id for c in lookups}) == len(lookups) == 2
        answers = [i for i in items if isinstance(i, ToolResultItem) and _text(i) == "found"]
        facts["each answered by its own result"] = [a.result.id for a in answers] == [
            c.call.id for c in lookups
        ]
        facts["no late second answer in history"] = _count(items, ToolResultItem, "late second answer") == 0
        facts["both answered"] = [i for i in items if i == AssistantText("Found it.")] == [
            AssistantText("Found it.")
        ] * 2
    elif name == "approval":
        mails = _calls(items, "send_email")
        decisions = [i for i in items if isinstance(i, ApprovalItem)]
        facts["one send_email call, waiting first"] = len(mails) == 1 and mails[0].needs_approval
        facts["one decision, the edit"] = [(d.decision, d.args) for d in decisions] == [("edit", EDITED_ARGS)]
        facts["the edited call answered once"] = _count(items, ToolResultItem, "mailed ops-team") == 1
        facts["the final answer"] = bool(items) and items[-1] == AssistantText("Mailed.")
    elif name == "elicit":
        facts["one confirm_delete call"] = len(_calls(items, "confirm_delete")) == 1
        facts["the answered call's result once"] = (
            _count(items, ToolResultItem, "deleted draft because stale") == 1
        )
        facts["the final answer"] = bool(items) and items[-1] == AssistantText("Deleted.")
    elif name == "signin":
        facts["one my_notes call"] = len(_calls(items, "my_notes")) == 1
        facts["the signed-in call's result once"] = _count(items, ToolResultItem, "notes of alice") == 1
        facts["the final answer"] = bool(items) and items[-1] == AssistantText("Here they are.")
    elif name == "timer":
        facts["one sleep"] = len(_calls(items, "sleep")) == 1
        facts["one wake-up"] = _count(items, ToolResultItem, "Slept for 60 seconds") == 1
        facts["the final answer"] = bool(items) and items[-1] == AssistantText("Awake.")
    return [f"{name}: expected {fact}" for fact, ok in facts.items() if not ok]


def check_snapshot(
    scenario: Scenario,
    snap: Snapshot,
    *,
    dispatches: DispatchLog,
    conflicting_bodies: Sequence[tuple[str, str]] = (),
    rekeyed_bodies: Sequence[str] = (),
    failures: Sequence[str] = (),
    prefix: str = "",
) -> list[str]:
    """Every invariant of a finished run; ``[]`` when it passed."""
    problems = [p for thread, view in sorted(snap.items()) for p in check_thread(thread, view)]
    problems += expect_scenario(scenario, snap, prefix)
    problems += dispatches.conflicts + dispatches.not_durable
    problems += [f"dedup id {key} was sent with two different bodies" for key in conflicting_bodies]
    problems += [f"not a derived dedup id — {found}" for found in rekeyed_bodies]
    problems += [f"step failed: {failure}" for failure in failures]
    return problems


async def unprocessed_inputs(state: StateStore, snap: Snapshot, delivered: dict[str, set[str]]) -> list[str]:
    """Every input delivered to a thread that is still open must be recorded as processed: folded in, or
    absorbed (a duplicate, a late answer to an answered call). An input left unrecorded was neither."""
    problems = []
    for thread, ids in sorted(delivered.items()):
        view = snap.get(thread)
        if view is None or view.info.closed:
            continue  # inputs to a closed thread are dropped by design
        missing = set(ids) - await state.filter_processed(thread, sorted(ids))
        if missing:
            problems.append(f"{thread}: inputs never recorded as processed {sorted(missing)}")
    return problems


async def check_memory_world(world: MemoryWorld) -> tuple[Snapshot, list[str]]:
    snap = await snapshot(world.conversation, world.state, world.scenario.roots())
    problems = check_snapshot(
        world.scenario,
        snap,
        dispatches=world.dispatches,
        conflicting_bodies=world.queue.conflicting_bodies,
        rekeyed_bodies=world.queue.sent.rekeyed_bodies,
        failures=world.failures,
    )
    problems += await unprocessed_inputs(world.state, snap, world.queue.sent.delivered)
    if world.queue.messages:
        problems.append(f"{len(world.queue.messages)} messages never acknowledged")
    return snap, problems


# ---- the same scenarios on DynamoDB + SQS (moto), through the real worker handler ---------------------


class RecordingSender:
    """Wraps the runtime's input-queue sender: records the body of every ``(thread, dedup id)`` and, with
    ``dedupe=False``, defeats SQS's deduplication (each send gets a fresh ``MessageDeduplicationId``; the
    logical id in the body is unchanged, so the worker's own dedup is what remains)."""

    def __init__(self, inner: Any, *, dedupe: bool) -> None:
        self.inner, self.dedupe = inner, dedupe
        self.bodies: dict[tuple[str, str], str] = {}
        self.conflicting_bodies: list[tuple[str, str]] = []
        self.sent = SendLog()
        self._sends = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def send(self, message: InputMessage, dedup_id: str) -> None:
        key = (message.group_id, dedup_id)
        body = message.model_dump_json()
        if self.bodies.setdefault(key, body) != body:
            self.conflicting_bodies.append(key)
        self.sent.record(message, dedup_id)
        if self.dedupe:
            await self.inner.send(message, dedup_id)
            return
        self._sends += 1
        logical = message if message.id is not None else message.model_copy(update={"id": dedup_id})
        await self.inner.send(logical, f"{dedup_id}#{self._sends}")


def aws_tools(runs: list[str]) -> list[Tool]:
    """The scenario tools the AWS runtime does not already have (it adds the built-ins and sleep tools)."""
    return [
        make_get_time(runs),
        make_send_email(runs),
        ConfirmDelete(runs),
        MyNotes(runs),
        Subscribe(),
        Ticker(),
        Lookup(),
    ]


def aws_context_window(runs: list[str]) -> int:
    from stepagent.tools.sleep import SleepUntil

    return context_window([*builtin_tools(), Sleep(), SleepUntil(), *aws_tools(runs)])


async def instrument_runtime(
    runtime: Any, plan: FaultPlan, *, dedupe: bool
) -> tuple[DispatchLog, RecordingSender]:
    """Put fault wrappers around every I/O the worker and the tool runner do: both stores (the step's and
    the output publisher's), the input-queue sender, SQS sends (outputs, tool queue, DLQ), claim-check
    resolution, the function runner and tool dispatch. The model's wrapper is given at creation."""
    system, worker = runtime.system, runtime.worker
    raw_conversation = runtime.conversation
    log = DispatchLog()

    raw_state = runtime.state

    async def is_committed(thread_id: str, tool_call_id: str) -> bool:
        if not await committed_in(raw_conversation, thread_id, tool_call_id):
            return False
        # a call resumed with a person's answer: the answer must be durable (processed) before it runs
        kept = await read_question(raw_state, thread_id, tool_call_id)
        if kept is not None and kept.answered_by is not None:
            return bool(await raw_state.filter_processed(thread_id, [kept.answered_by]))
        return True

    sender = RecordingSender(runtime.sender, dedupe=dedupe)
    faulty_sender = Faulty(sender, plan, "queue")
    queues = Faulty(runtime.queues, plan, "sqs")
    runtime.sender = system.config.sender = faulty_sender
    runtime.queues = worker.queues = worker.publisher.queues = queues
    system.conversation = worker.publisher.conversation = Faulty(raw_conversation, plan, "conversation")
    system.state = worker.publisher.state = Faulty(runtime.state, plan, "state")
    system.config.runner = Faulty(system.config.runner, plan, "runner")
    system.config.toolset = probed(list(system.config.toolset), plan, log, is_committed)
    return log, sender


def expected_output_ids(snap: Snapshot) -> dict[str, tuple[str, int, str]]:
    """The output event every committed row must have produced (``event_id`` -> thread, order, kind),
    except the rows a spawn seeds directly into a new child (they are not the child's step output)."""
    from stepagent.outputs.build import row_events

    expected: dict[str, tuple[str, int, str]] = {}
    for thread, view in snap.items():
        for row in view.rows:
            if row.message_id.endswith(SEEDED_ROW_SUFFIXES):
                continue
            for event in row_events(thread, [row]):
                expected[event["event_id"]] = (thread, row.order, event["type"])
    return expected


SEEDED_ROW_SUFFIXES = ("-spawn-call", "-spawn-result", "-event-call", "-compaction-call")
