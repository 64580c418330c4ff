"""Seeded generator of logical conversations, shared by the SDK byte-equivalence tests.

A conversation is generated as *logical turns* (what happened), not as history items or wire messages.
Each test turns the same logical turns into (a) stored history items for our provider and (b) the vendor
SDK's own call arguments, built directly from the API documentation by the test's oracle. Our translation
code is never used to produce the expected bytes; only tiny wire helpers without translation rules
(tool-id normalisation, media-type lookup) are shared, so a translation bug cannot hide in both sides.

Every corpus of 200 seeds covers: plain text, tool call/result pairs, an unanswered trailing call,
synthetic ``receive_event__injected`` pairs, images in user content and tool results, non-BMP emoji,
U+2028/U+2029, empty tool output, empty user text, a 300 KB row, compaction summaries, signed and redacted
reasoning, ids that need normalising.
"""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass, field
from typing import Any

from stepagent.history_items import (
    INJECTED_TOOL_NAME,
    AssistantText,
    EventItem,
    HistoryItem,
    Reasoning,
    Summary,
    ToolCallItem,
    ToolResultItem,
    UserItem,
)
from stepagent.messages import ImageBlock, ImageContent, TextBlock, TextContent, ToolCall, ToolResult
from stepagent.providers.base import ToolSpec

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(40))).decode()
JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + bytes(range(30))).decode()
GIF = base64.b64encode(b"GIF89a" + bytes(20)).decode()
BIG_ROW = 300 * 1024

_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "κόσμος",
    "日本語",
    "naïve",
    "😀",
    "🧪🔬",
    "\u2028",
    "\u2029",
    "tab\tx",
    '"q"',
    "\\",
]


@dataclass
class LText:
    text: str


@dataclass
class LImage:
    data: str
    media_type: str | None


@dataclass
class LAssistant:
    reasoning: list[tuple[str, str | None, str | None]] = field(default_factory=list)  # text, sig, redacted
    text: str | None = None
    call: tuple[str, str, dict[str, Any]] | None = None  # id, name, arguments
    reasoning_after_text: bool = False  # interleaved thinking: text streamed before the reasoning


@dataclass
class LResult:
    call_id: str
    blocks: list[tuple[str, str, str | None]]  # ("text", text, None) | ("image", data, media_type)


@dataclass
class LEvent:
    invocation_id: str
    original_id: str
    original_name: str
    blocks: list[tuple[str, str, str | None]]


@dataclass
class LSummary:
    text: str


Logical = LText | LImage | LAssistant | LResult | LEvent | LSummary


@dataclass
class Case:
    seed: int
    system: str
    tools: list[ToolSpec]
    turns: list[Logical]
    images: bool  # the model accepts image input
    window: int  # context window for ModelInfo (0 = unknown)


def _text(rng: random.Random, *, allow_empty: bool = True) -> str:
    roll = rng.random()
    if allow_empty and roll < 0.05:
        return rng.choice(["", "   ", "\n"])
    count = rng.randint(1, 12)
    return " ".join(rng.choice(_WORDS) for _ in range(count))


def _big(rng: random.Random) -> str:
    unit = "row 😀 data \u2028 " + rng.choice(_WORDS) + "\n"
    return (unit * (BIG_ROW // len(unit.encode()) + 1))[: BIG_ROW // 2] + "x" * (BIG_ROW // 2)


def _id(rng: random.Random, counter: list[int]) -> str:
    counter[0] += 1
    style = rng.random()
    if style < 0.1:
        return f"call:{counter[0]}/odd id"  # needs normalising
    if style < 0.2:
        return f"{counter[0]:08d}-aaaa-bbbb-cccc-{rng.getrandbits(48):012x}"
    return f"call_{counter[0]}_{rng.getrandbits(32):08x}"


def _blocks(rng: random.Random, big: list[bool]) -> list[tuple[str, str, str | None]]:
    roll = rng.random()
    if roll < 0.1:
        return [("text", "", None)]  # empty tool output
    if roll < 0.15 and not big[0]:
        big[0] = True
        return [("text", _big(rng), None)]
    blocks: list[tuple[str, str, str | None]] = [("text", _text(rng, allow_empty=False), None)]
    if rng.random() < 0.2:
        data, media_type = rng.choice([(PNG, "image/png"), (JPEG, None), (GIF, "image/gif")])
        blocks.append(("image", data, media_type))
        if rng.random() < 0.3:
            blocks.append(("text", "", None))
    return blocks


def generate(seed: int) -> Case:
    rng = random.Random(seed)
    counter = [0]
    big = [False]
    turns: list[Logical] = []
    if rng.random() < 0.15:
        turns.append(LSummary("earlier: " + _text(rng, allow_empty=False)))
        if rng.random() < 0.5:  # the summary is followed by the model's own continuation
            signed = (_text(rng, allow_empty=False), f"sig-{rng.getrandbits(64):x}", None)
            turns.append(LAssistant(reasoning=[signed], text=_text(rng)))
    calls: list[tuple[str, str]] = []
    for _ in range(rng.randint(1, 7)):
        turns.append(LText(_text(rng)))
        if rng.random() < 0.15:
            turns.append(LImage(*rng.choice([(PNG, "image/png"), (JPEG, "image/jpeg"), (GIF, None)])))
        if rng.random() < 0.1:
            turns.append(LText(_text(rng)))  # two user inputs in a row
        for _ in range(rng.randint(1, 3)):
            step = LAssistant()
            if rng.random() < 0.3:
                step.reasoning.append((_text(rng, allow_empty=False), f"sig-{rng.getrandbits(64):x}", None))
            if rng.random() < 0.1:
                step.reasoning.append(("", None, base64.b64encode(rng.randbytes(12)).decode()))
            if rng.random() < 0.7:
                step.text = _text(rng)
                step.reasoning_after_text = rng.random() < 0.3
            if rng.random() < 0.6:
                call_id = _id(rng, counter)
                name = rng.choice(["get_time", "search", "spawn_thread"])
                step.call = (call_id, name, {"q": _text(rng, allow_empty=False), "n": rng.randint(0, 9)})
            if not step.reasoning and step.text is None and step.call is None:
                step.text = "ok"
            turns.append(step)
            if step.call is None:
                break
            turns.append(LResult(step.call[0], _blocks(rng, big)))
            calls.append((step.call[0], step.call[1]))
        while calls and rng.random() < 0.25:
            original, name = rng.choice(calls)
            turns.append(LEvent(_id(rng, counter), original, name, _blocks(rng, big)))
    if rng.random() < 0.25:
        turns.append(
            LAssistant(text=rng.choice([None, "let me check"]), call=(_id(rng, counter), "search", {}))
        )
    tools = [
        ToolSpec("get_time", "Current time 😀", {"type": "object", "properties": {}}),
        ToolSpec(
            "search", "Search\u2028the web", {"type": "object", "properties": {"q": {"type": "string"}}}
        ),
    ][: rng.randint(0, 2)]
    system = rng.choice(["", "You are helpful. 🧪", "System\u2028prompt with κόσμος"])
    return Case(seed, system, tools, turns, images=rng.random() < 0.5, window=rng.choice([0, 1_000_000]))


def _result(call_id: str, blocks: list[tuple[str, str, str | None]]) -> ToolResult:
    content: list[TextBlock | ImageBlock] = []
    for kind, value, media_type in blocks:
        content.append(
            TextBlock(text=value) if kind == "text" else ImageBlock(data=value, media_type=media_type)
        )
    return ToolResult(id=call_id, content=content)


def history(case: Case) -> list[HistoryItem]:
    """The stored history our provider receives for ``case``."""
    items: list[HistoryItem] = []
    for turn in case.turns:
        match turn:
            case LSummary(text=text):
                items.append(Summary(text=text, up_to_order=3))
            case LText(text=text):
                items.append(UserItem(TextContent(text=text)))
            case LImage(data=data, media_type=media_type):
                items.append(UserItem(ImageContent(data=data, media_type=media_type)))
            case LAssistant(reasoning=reasoning, text=text, call=call, reasoning_after_text=after):
                if text is not None and after:
                    items.append(AssistantText(text))
                for r_text, signature, redacted in reasoning:
                    items.append(Reasoning(r_text, signature, redacted))
                if text is not None and not after:
                    items.append(AssistantText(text))
                if call is not None:
                    items.append(ToolCallItem(ToolCall(id=call[0], name=call[1], arguments=call[2])))
            case LResult(call_id=call_id, blocks=blocks):
                items.append(ToolResultItem(_result(call_id, blocks)))
            case LEvent(invocation_id=inv, original_id=original, original_name=name, blocks=blocks):
                invocation = ToolCall(
                    id=inv,
                    name=INJECTED_TOOL_NAME,
                    arguments={
                        "original_args": {},
                        "original_tool_call_id": original,
                        "original_tool_name": name,
                    },
                )
                items.append(
                    EventItem(result=_result(inv, blocks), tool_call_id=original, invocation=invocation)
                )
    return items


def first_difference(ours: bytes, theirs: bytes) -> str:
    """A readable description of where two bodies diverge (offset and ±80 bytes of context)."""
    offset = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs))
    )
    lo = max(0, offset - 80)
    return (
        f"bodies differ at byte {offset} (ours {len(ours)} bytes, SDK {len(theirs)} bytes)\n"
        f"ours: {ours[lo : offset + 80]!r}\nSDK:  {theirs[lo : offset + 80]!r}"
    )


def coverage(cases: list[Case]) -> dict[str, int]:
    """How many cases exercise each feature, so a test can assert the corpus is not vacuous."""
    counts = dict.fromkeys(
        ["tool_pair", "trailing_call", "event", "user_image", "result_image", "emoji", "u2028", "empty_output",
         "big_row", "summary", "signed_reasoning", "redacted", "odd_id", "no_images", "thinking_not_first"], 0
    )  # fmt: skip
    for case in cases:
        flags: set[str] = set()
        last = case.turns[-1]
        if isinstance(last, LAssistant) and last.call is not None:
            flags.add("trailing_call")
        if not case.images:
            flags.add("no_images")
        previous: Logical | None = None
        for turn in case.turns:
            texts: list[str] = []
            if isinstance(turn, LResult | LEvent):
                flags.add("tool_pair" if isinstance(turn, LResult) else "event")
                for kind, value, _ in turn.blocks:
                    if kind == "image":
                        flags.add("result_image")
                    elif not value:
                        flags.add("empty_output")
                    else:
                        texts.append(value)
            elif isinstance(turn, LText):
                texts.append(turn.text)
            elif isinstance(turn, LImage):
                flags.add("user_image")
            elif isinstance(turn, LSummary):
                flags.add("summary")
            elif isinstance(turn, LAssistant):
                texts.append(turn.text or "")
                if turn.reasoning and (
                    (turn.reasoning_after_text and turn.text) or isinstance(previous, LSummary)
                ):
                    flags.add("thinking_not_first")
                for _, signature, redacted in turn.reasoning:
                    flags.add("redacted" if redacted else "signed_reasoning" if signature else "")
                if turn.call and ":" in turn.call[0]:
                    flags.add("odd_id")
            joined = "".join(texts)
            if any(ord(ch) > 0xFFFF for ch in joined):
                flags.add("emoji")
            if "\u2028" in joined:
                flags.add("u2028")
            if len(joined.encode()) >= BIG_ROW:
                flags.add("big_row")
            previous = turn
        for flag in flags & counts.keys():
            counts[flag] += 1
    return counts
