"""``prompt_cache`` section of ``make bench``: what a long tool-using conversation costs in model input,
billed by the project's own model of Anthropic's prompt cache (:mod:`bench.prompt_billing`).

The conversation runs through the real engine (step mode, in-memory stores, the in-process queue) and
the real Anthropic provider, whose HTTP client talks to :class:`FakeMessagesApi`: an ``httpx``
``MockTransport`` that bills each request body on a simulated clock, rejects a request over the model's
window as the API does (``prompt is too long``), and answers as a small deterministic agent would:

- each turn: a user question → one ``lookup`` call → a ~2,000-character result → a ~200-word answer (the
  lookup is a dispatched function answered within a second, or in the gap runs a remote call answered
  7 minutes later);
- a ~1,500-token configured system prompt, two tools of the deployment (``lookup``, ``convert``) plus the
  built-in tools;
- optionally a child spawned at given turns (the parent delegates; the child reports and closes), and the
  compaction threads the runtime starts (they summarise and close).

Runs (:func:`prompt_cache_costs`): no compaction (200k window); compaction in a 16k window at 3.5 and
4 bytes per token; children at turns 5, 15 and 25; and 7-minute gaps (the lookup is a slow remote call
answered 7 minutes later, and the user writes 7 minutes after the answer) with ``auto``, ``5m`` and
``1h``; and a plain tool-using chat (fast lookup) whose person writes 7 minutes, or under a minute, after each
answer, with ``auto``. Each run reports the billed cost over the physical limit, failed steps, answered turns, and the
cache-read share of the compaction threads' and children's first requests, next to its targets
(:func:`prompt_cache_costs` lists them).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx

from bench.prompt_billing import Bill, PromptCacheBilling, physical_limit
from stepagent.agent_config import AgentConfig
from stepagent.core.step import StepConfig
from stepagent.events import EventCollector, StepFailed
from stepagent.messages import InputMessage
from stepagent.modes.step_mode import AgentSystem
from stepagent.providers.anthropic import AnthropicProvider
from stepagent.providers.base import ModelInfo
from stepagent.senders.inprocess import InProcessSender
from stepagent.stores.memory import memory_stores
from stepagent.testing.inprocess import InProcessQueueDriver
from stepagent.tools.base import Tool, ToolContext, Toolset
from stepagent.tools.builtins import builtin_tools
from stepagent.transcript import tree_items

MODEL = "claude-sonnet-4-5"
SYSTEM_PROMPT = "You are the research assistant of a small engineering team. " + " ".join(
    f"Guideline {n}: check the facts with the lookup tool before you answer, cite what it says, "
    "keep units consistent, and say plainly when the data is missing."
    for n in range(1, 40)
)  # ~6,000 bytes: ~1,500 tokens at 4 bytes a token
ANSWER_WORDS = 200
RESULT_CHARS = 2_000
MODEL_SECONDS = 3.0  # simulated time a model call takes
GAP_SECONDS = 7 * 60
THRESHOLD = 0.75  # STEPAGENT_COMPACTION_THRESHOLD's default
PROMPT_SECONDS = 55.0  # a person who answers within a minute


class Lookup(Tool):
    """The conversation's lookup: asynchronous; its result is delivered by the driver (at once, or after
    the run's gap). ``wait``: a dispatched function (``tool``) or a slow remote call (``rap``)."""

    name: ClassVar[str] = "lookup"
    description: ClassVar[str] = "Look a fact up in the team's knowledge base."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What to look up."}},
        "required": ["query"],
    }

    def __init__(self, wait: str = "tool") -> None:
        self.wait = wait  # type: ignore[misc]  # per instance: the run decides what the lookup is
        self.pending: list[tuple[ToolContext, str]] = []

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> None:
        query = str(arguments.get("query", ""))
        self.pending.append((context, query))
        return None


class Convert(Tool):
    """A second tool the agent is offered (never called in this conversation)."""

    name: ClassVar[str] = "convert"
    description: ClassVar[str] = "Convert a quantity between units."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "value": {"type": "number"},
            "from_unit": {"type": "string"},
            "to_unit": {"type": "string"},
        },
        "required": ["value", "from_unit", "to_unit"],
    }
    inline: ClassVar[bool] = True


def lookup_result(query: str) -> str:
    line = f"LOOKUP RESULT for {query}: the measured value stays within the documented tolerance band. "
    return (line * (RESULT_CHARS // len(line) + 1))[:RESULT_CHARS]


def answer_text(turn: str) -> str:
    words = [f"Answer {turn}:"] + [f"point{n % 17}" for n in range(ANSWER_WORDS)]
    return " ".join(words)


def _last_block(body: dict[str, Any]) -> dict[str, Any]:
    content = body["messages"][-1]["content"]
    return content[-1] if isinstance(content, list) else {"type": "text", "text": content}


def _text_of(block: dict[str, Any]) -> str:
    if block.get("type") == "tool_result":
        return " ".join(c.get("text", "") for c in block.get("content", []) if isinstance(c, dict))
    return str(block.get("text", ""))


@dataclass
class Reply:
    text: str = ""
    tool: tuple[str, dict[str, Any]] | None = None
    kind: str = "turn"  # what kind of request this answered (for the measurements)


def agent_reply(body: dict[str, Any]) -> Reply:
    """The deterministic agent's answer to a request (see the module docstring)."""
    last = _last_block(body)
    text = _text_of(last)
    if "INSIDE a compaction thread" in text:
        child = re.search(r"close_thread with your thread ID \(([^)]+)\)", text)
        summary = "Summary of the conversation so far: " + "the questions were answered from lookups. " * 35
        thread = child.group(1) if child else ""
        return Reply(
            tool=("close_thread", {"thread_id": thread, "report_to_parent": summary}), kind="compaction"
        )
    if "You are now INSIDE the thread that you requested" in text:
        child = re.search(r"Your thread ID is (\S+?)\.", text)
        report = "The delegated review is done: nothing to change."
        thread = child.group(1) if child else ""
        return Reply(tool=("close_thread", {"thread_id": thread, "report_to_parent": report}), kind="child")
    if text.startswith("LOOKUP RESULT for "):
        turn = text.removeprefix("LOOKUP RESULT for ").split(":", 1)[0]
        return Reply(text=answer_text(turn))
    if "successfully spawned" in text:
        return Reply(text="I delegated the review to a child thread.")
    if "Report from child" in text or "has shut down" in text:
        return Reply(text="The child finished its review.", kind="report")
    match = re.match(r"(Question|Delegate) (\d+):", text)
    if match and match.group(1) == "Delegate":
        system = " ".join(b.get("text", "") for b in body.get("system", []))
        root = re.search(r"The root thread ID is `([^`]+)`", system)
        stack = [root.group(1)] if root else []
        arguments = {"instructions": f"Review the findings of turn {match.group(2)}.", "child_of": stack}
        return Reply(tool=("spawn_thread", arguments))
    if match:
        return Reply(tool=("lookup", {"query": match.group(2)}))
    return Reply(text="OK.")


def _sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events)


@dataclass
class FakeMessagesApi:
    """The fake ``/v1/messages``: bills, enforces the window, answers (see the module docstring)."""

    billing: PromptCacheBilling
    context_window: int
    requests: list[tuple[str, Bill]] = field(default_factory=list)  # (kind, bill)
    rejected: int = 0
    counter: int = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.billing.now += MODEL_SECONDS
        reply = agent_reply(body)
        bill = self.billing.bill(body)
        if bill.total + int(body.get("max_tokens", 0)) > self.context_window:
            self.rejected += 1
            self.billing.bills.pop()
            self.billing.prefixes.pop()
            error = {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": f"prompt is too long: {bill.total} tokens > {self.context_window} maximum",
                },
            }
            return httpx.Response(400, json=error)
        self.requests.append((reply.kind, bill))
        self.counter += 1
        usage = {
            "input_tokens": bill.input,
            "cache_read_input_tokens": bill.cache_read,
            "cache_creation_input_tokens": bill.cache_write,
            "output_tokens": 1,
        }
        start = {"type": "message", "id": f"msg_{self.counter}", "role": "assistant", "model": MODEL}
        events: list[dict[str, Any]] = [
            {"type": "message_start", "message": {**start, "content": [], "usage": usage}}
        ]
        if reply.tool is not None:
            name, arguments = reply.tool
            digest = hashlib.sha256(request.content).hexdigest()[:20]
            block = {"type": "tool_use", "id": f"toolu_{digest}", "name": name, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(arguments)}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": reply.text}
            stop = "end_turn"
        output = len(json.dumps(reply.tool) if reply.tool else reply.text) // 4
        events += [
            {"type": "content_block_start", "index": 0, "content_block": block},
            {"type": "content_block_delta", "index": 0, "delta": delta},
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": output}},
            {"type": "message_stop"},
        ]
        return httpx.Response(200, content=_sse(events), headers={"content-type": "text/event-stream"})


@dataclass
class RunResult:
    """One conversation's figures."""

    turns: int
    answered: int
    failed_steps: int
    rejected_requests: int
    requests: int
    cost: float
    limit: float
    compactions: int
    compaction_read_shares: list[float]
    child_inherited_read_shares: list[float]
    ttl_1h_write_tokens: int
    #: The request sent just before the first compaction thread's, over the window: how full the real
    #: window was when the first compaction started (``None``: none started).
    first_compaction_share: float | None = None

    @property
    def ratio(self) -> float:
        return self.cost / self.limit if self.limit else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "answered_turns": self.answered,
            "failed_steps": self.failed_steps,
            "rejected_requests": self.rejected_requests,
            "requests": self.requests,
            "billed_input_cost": round(self.cost),
            "physical_limit": round(self.limit),
            "cost_over_limit": round(self.ratio, 3),
            "compactions": self.compactions,
            "compaction_first_request_read_shares": [round(s, 3) for s in self.compaction_read_shares],
            "child_first_request_inherited_read_shares": [
                round(s, 3) for s in self.child_inherited_read_shares
            ],
            "one_hour_write_tokens": self.ttl_1h_write_tokens,
            "first_compaction_share_of_window": (
                None if self.first_compaction_share is None else round(self.first_compaction_share, 3)
            ),
        }


async def run_conversation(
    *,
    turns: int = 40,
    context_window: int = 200_000,
    bytes_per_token: float = 4.0,
    ttl: str = "auto",
    spawn_at: Sequence[int] = (),
    tool_seconds: float = 1.0,
    user_seconds: float = 20.0,
    slow_lookup: bool = False,
) -> RunResult:
    """Run the conversation once and bill it (see the module docstring)."""
    billing = PromptCacheBilling(bytes_per_token=bytes_per_token)
    api = FakeMessagesApi(billing, context_window)
    client = httpx.AsyncClient(transport=httpx.MockTransport(api.handler))
    info = ModelInfo(MODEL, context_window=context_window, max_output_tokens=64_000, provider="anthropic")
    provider = AnthropicProvider(MODEL, api_key="bench", info=info, http_client=client)
    lookup = Lookup("rap" if slow_lookup else "tool")
    conversation, state = memory_stores()
    sender = InProcessSender()
    config = StepConfig(
        provider=provider,
        toolset=Toolset.of([lookup, Convert(), *builtin_tools()]),
        sender=sender,
        agent=AgentConfig(system_prompt=SYSTEM_PROMPT, max_tokens=1_024, prompt_cache_ttl=ttl),
        clock=lambda: billing.now,  # the runtime sees the simulated time: a person's pace is measured on it
    )
    driver = InProcessQueueDriver(AgentSystem(conversation, state, config), sender)
    failed = 0
    observer = EventCollector()

    async def settle() -> None:
        nonlocal failed
        while True:
            for result in await driver.run_until_idle(observer):
                failed += result.error is not None
            failed += sum(isinstance(event, StepFailed) for _, event in observer.take())
            if not lookup.pending:
                return
            billing.now += tool_seconds
            pending, lookup.pending = lookup.pending, []
            for context, query in pending:
                await context.send_result(lookup_result(query))

    root = "bench-root"
    for turn in range(1, turns + 1):
        kind = "Delegate" if turn in spawn_at else "Question"
        text = f"{kind} {turn}: what does the knowledge base say about item {turn} of the plan? " * 3
        await driver.send(InputMessage.user_text(root, text, id=f"user-{turn}"), f"user-{turn}")
        await settle()
        billing.now += user_seconds
    await client.aclose()
    items = [item async for item in tree_items(conversation, root)]
    answers = {
        str(item["text"]).split(":", 1)[0]
        for item in items
        if item["thread_id"] == root
        and item["kind"] == "assistant"
        and str(item["text"]).startswith("Answer ")
    }
    questions = [t for t in range(1, turns + 1) if t not in spawn_at]
    answered = sum(f"Answer {t}" in answers for t in questions)
    compaction = [bill.read_share for kind, bill in api.requests if kind == "compaction"]
    # How full the real window was when the first compaction started: the last request before it.
    first_index = next((n for n, (kind, _) in enumerate(api.requests) if kind == "compaction"), None)
    first = None if not first_index else api.requests[first_index - 1][1].total
    children = []
    for kind, bill in api.requests:
        if kind == "child":
            seed = bill.total - bill.cache_read - bill.cache_write  # the uncached tail: the seed message
            inherited = max(1, bill.total - max(seed, 0))
            children.append(min(1.0, bill.cache_read / inherited))
    return RunResult(
        turns=turns,
        answered=answered + sum(1 for t in spawn_at if t <= turns),
        failed_steps=failed,
        rejected_requests=api.rejected,
        requests=len(api.requests),
        cost=sum(bill.cost for _, bill in api.requests),
        limit=physical_limit(billing.prefixes),
        compactions=len(compaction),
        compaction_read_shares=compaction,
        child_inherited_read_shares=children,
        ttl_1h_write_tokens=sum(bill.cache_write_1h for _, bill in api.requests),
        first_compaction_share=None if first is None else first / context_window,
    )


def _ok(value: bool) -> bool:
    return bool(value)


async def prompt_cache_costs(quick: bool = False) -> dict[str, Any]:
    """Every run of the section with its targets (see the module docstring)."""
    turns = 12 if quick else 40
    runs: dict[str, RunResult] = {}
    runs["no_compaction"] = await run_conversation(turns=turns)
    for bpt in (3.5, 4.0):
        runs[f"compaction_16k_{bpt}_bytes_per_token"] = await run_conversation(
            turns=turns, context_window=16_000, bytes_per_token=bpt
        )
    runs["children_at_5_15_25"] = await run_conversation(turns=turns, spawn_at=(5, 15, 25))
    for ttl in ("auto", "5m", "1h"):
        runs[f"gaps_7min_{ttl}"] = await run_conversation(
            turns=turns, ttl=ttl, tool_seconds=GAP_SECONDS, user_seconds=GAP_SECONDS, slow_lookup=True
        )
    # A plain tool-using chat (the lookup answers within a second) whose person writes every 7 minutes,
    # or within a minute: the end of each turn is the only slow wait.
    runs["slow_person_7min_auto"] = await run_conversation(turns=turns, user_seconds=GAP_SECONDS)
    runs["prompt_person_1min_auto"] = await run_conversation(turns=turns, user_seconds=PROMPT_SECONDS)
    targets: dict[str, Any] = {
        "no_compaction_cost_over_limit<=1.02": _ok(runs["no_compaction"].ratio <= 1.02),
        "gaps_7min_auto_cost_over_limit<=1.2": _ok(runs["gaps_7min_auto"].ratio <= 1.2),
        "slow_person_7min_auto_cost_over_limit<=1.2": _ok(runs["slow_person_7min_auto"].ratio <= 1.2),
        "prompt_person_1min_auto_cost_over_limit<=1.02": _ok(runs["prompt_person_1min_auto"].ratio <= 1.02),
    }
    for bpt in (3.5, 4.0):
        run = runs[f"compaction_16k_{bpt}_bytes_per_token"]
        targets[f"compaction_16k_{bpt}: no failed step, every turn answered"] = _ok(
            run.failed_steps == 0 and run.answered == run.turns
        )
        targets[f"compaction_16k_{bpt}: compaction requests >= 90% cache reads"] = _ok(
            bool(run.compaction_read_shares) and min(run.compaction_read_shares) >= 0.9
        )
        share = run.first_compaction_share
        targets[
            f"compaction_16k_{bpt}: first compaction within 10% of the threshold (0.75 of the window)"
        ] = _ok(share is not None and abs(share - THRESHOLD) <= 0.1 * THRESHOLD)
    children = runs["children_at_5_15_25"].child_inherited_read_shares
    targets["child first request >= 90% cache reads on its inherited part"] = _ok(
        bool(children) and min(children) >= 0.9
    )
    return {
        "method": (
            "One tool-using conversation through the engine and the Anthropic provider against a fake Messages "
            "API (bench/prompt_billing.py: breakpoints, prefix match, 20-block lookback, 5-minute and 1-hour "
            "TTLs on a simulated clock, 1,024-token minimum, tokens = UTF-8 bytes / bytes_per_token). Cost "
            "in uncached-input-token equivalents (read 0.1, 5-minute write 1.25, 1-hour write 2.0); the "
            "physical limit writes each token once and reads it afterwards."
        ),
        "runs": {name: run.as_dict() for name, run in runs.items()},
        "targets": targets,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(prompt_cache_costs()), indent=2))
