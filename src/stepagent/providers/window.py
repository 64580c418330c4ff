"""Context accounting: a cheap token estimate and one-pass truncation of tool outputs that overflow.

The estimate (:func:`estimate_item`, :func:`estimate_text`) needs no tokenizer and no network (tiktoken
would have to download its vocabulary, which the Lambda must not do at cold start). It is

    ceil(UTF-8 bytes / 3) per text + 8 tokens of framing per history item + 1,600 tokens per image.

Accuracy, stated honestly: byte-level BPE vocabularies (Claude, GPT-4o/o200k) spend about 4 bytes per
token on English prose, 3-3.5 on code and JSON, and about 1 token per CJK character (3 bytes), so the
estimate over-counts prose by ~25-35% and is close for code, JSON and CJK. It is *not* a strict upper
bound: random base64/hex, long digit runs and some emoji sequences can cost more than one token per 3
bytes (up to ~1 token per 2 bytes), so an adversarial request can be under-counted by up to ~35%. The
only strict bound (tokens <= bytes) would over-count prose fourfold and truncate tool outputs long before
the engine's compaction (75% of the window, measured with the provider's real usage) gets a chance.
Images are charged Anthropic's cost of a full-size image (~1,600 tokens).

:func:`truncate_for_window` guarantees:

- One pass: every row is estimated exactly once (``rows_examined``); no re-estimation of the whole
  request per candidate (that is quadratic).
- Oldest first, in stable steps: tool outputs (tool results and synthetic event results — never user
  text, assistant text, reasoning or tool calls) are replaced by the stub
  ``[tool output truncated: N characters]`` from the start of the history up to a *cut*. The cut can
  only sit on a grid that is a function of the history's prefix: the positions where the running total
  of what stubbing would save first reaches 1, 2, 3 … times a step of :data:`CUT_STEP_SHARE` of the
  budget. The chosen cut is the first grid position that fits. History only grows between compactions,
  so every grid position, once reached, stays where it is, and the cut moves forward by whole steps only
  when the conversation has grown by about a step: the request's prefix (and the provider's prompt cache
  of it) changes rarely instead of at every request. No state is kept: the same history gives the same
  cut, in any process, so a retry or the next step re-sends identical bytes. Stored history is never
  changed; only the outgoing request is.
- If even replacing every candidate cannot fit, it raises :class:`ContextOverflow` (a non-retryable
  ProviderError) at once; the engine checks :func:`overflows` before it calls the model and compacts
  the thread instead.

Measured scale: each model call measures the provider's input tokens per estimated token of the request it
sent (:func:`estimate_scale`; ~0.75 for English prose). A thread's later requests carry it
(``ModelRequest.estimate_scale``): the compaction trigger compares the estimate times the scale with the
threshold's share of the window, so prose compacts near the configured share, not at half of it; the hard
checks (truncation, :func:`overflows`) count items at the scale times :data:`SCALE_MARGIN`, but tool
outputs never below their estimate (:func:`hard_estimate`: they may be far denser than the conversation
measured). An unmeasured thread uses the estimate as it is.

The engine decides compaction from the same estimate (:func:`request_estimate`), with a limit below the
hard budget by :data:`COMPACTION_HEADROOM` (:func:`compaction_helps`), so a thread compacts before any of
its tool outputs would be truncated and while its compaction thread can still read it whole. What a
compaction summarises ends before the inputs the model has not answered yet (:func:`unanswered_start`).
A window that cannot hold the fixed part of a request (:func:`fixed_part_error`) makes no compaction.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stepagent.errors import ProviderError
from stepagent.history_items import (
    ApprovalItem,
    AssistantText,
    EventItem,
    HistoryItem,
    Reasoning,
    Summary,
    ToolCallItem,
    ToolResultItem,
    UserItem,
)
from stepagent.messages import ImageBlock, TextBlock, TextContent, ToolResult
from stepagent.providers.base import Final, ModelRequest, StreamEvent, ToolSpec

_log = logging.getLogger(__name__)

BYTES_PER_TOKEN = 3
ITEM_FRAMING_TOKENS = 8
IMAGE_TOKENS = 1600
TRUNCATED_STUB = "[tool output truncated: {chars} characters]"
#: The truncation cut moves in steps of this share of the budget (see the module docstring).
CUT_STEP_SHARE = 0.25

Estimate = Callable[[HistoryItem], int]


def estimate_text(text: str) -> int:
    """The estimated tokens of ``text``: its UTF-8 bytes divided by :data:`BYTES_PER_TOKEN`, rounded up."""
    size = len(text.encode("utf-8", "surrogatepass"))
    return -(-size // BYTES_PER_TOKEN)


def _result_tokens(result: ToolResult) -> int:
    total = 0
    for block in result.content:
        if isinstance(block, TextBlock):
            total += estimate_text(block.text)
        else:
            total += IMAGE_TOKENS
    return total


def estimate_item(item: HistoryItem) -> int:
    """The estimated tokens of one history item as it appears in a request (see the module docstring)."""
    tokens = ITEM_FRAMING_TOKENS
    match item:
        case UserItem(content=content):
            if isinstance(content, TextContent):
                tokens += estimate_text(content.text)
            elif isinstance(content, ImageBlock):
                tokens += IMAGE_TOKENS
            else:
                tokens += estimate_text(json.dumps(content.model_dump(), ensure_ascii=False))
        case AssistantText(text=text):
            tokens += estimate_text(text)
        case Reasoning(text=text, signature=signature, redacted=redacted):
            tokens += estimate_text(text) + estimate_text(signature or "") + estimate_text(redacted or "")
        case ToolCallItem(call=call):
            tokens += estimate_text(call.name) + estimate_text(json.dumps(call.arguments, ensure_ascii=False))
        case ToolResultItem(result=result):
            tokens += _result_tokens(result)
        case EventItem(result=result, invocation=invocation):
            tokens += ITEM_FRAMING_TOKENS + _result_tokens(result)
            if invocation is not None:
                tokens += estimate_text(invocation.name)
                tokens += estimate_text(json.dumps(invocation.arguments, ensure_ascii=False))
        case Summary():
            tokens += estimate_text(item.rendered)
    return tokens


def estimate_fixed(system: str, tools: Sequence[ToolSpec]) -> int:
    """The estimated tokens of the system prompt and tool definitions."""
    specs = [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools]
    return ITEM_FRAMING_TOKENS + estimate_text(system) + estimate_text(json.dumps(specs, ensure_ascii=False))


@dataclass(frozen=True, slots=True)
class TruncationReport:
    """What :func:`truncate_for_window` did: rows examined and replaced (and their positions), the history's
    estimate before and after, and the budget (tokens)."""

    rows_examined: int
    rows_replaced: int
    estimate_before: int
    estimate_after: int
    budget: int
    replaced_positions: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, int]:
        return {
            "rows_examined": self.rows_examined,
            "rows_replaced": self.rows_replaced,
            "estimate_before": self.estimate_before,
            "estimate_after": self.estimate_after,
            "budget": self.budget,
        }


def _stub(item: ToolResultItem | EventItem) -> ToolResultItem | EventItem:
    chars = sum(len(b.text) if isinstance(b, TextBlock) else len(b.data) for b in item.result.content)
    text = TRUNCATED_STUB.format(chars=chars)
    result = ToolResult(id=item.result.id, call_id=item.result.call_id, content=[TextBlock(text=text)])
    return dataclasses.replace(item, result=result)


class ContextOverflow(ProviderError):
    """The request does not fit the model's window even with every tool output truncated: the thread has
    to be compacted before the model can be asked."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


def truncate_for_window(
    history: Sequence[HistoryItem], budget: int, estimate: Estimate = estimate_item
) -> tuple[list[HistoryItem], TruncationReport]:
    """Fit ``history`` into ``budget`` tokens by stubbing tool outputs oldest first, up to a cut on the
    stable grid (see the module docstring), in one pass."""
    sizes = [estimate(item) for item in history]  # the only estimate of each original row
    total = sum(sizes)
    if total <= budget:
        return list(history), TruncationReport(len(history), 0, total, total, budget)
    step = max(1, int(budget * CUT_STEP_SHARE))
    needed = total - budget
    stubs: dict[int, HistoryItem] = {}
    saved = 0
    enough: tuple[int, int] | None = None  # (stubs, saved) when the saving first sufficed
    for index, item in enumerate(history):
        if not isinstance(item, ToolResultItem | EventItem):
            continue
        stub = _stub(item)
        saving = sizes[index] - estimate(stub)
        if saving <= 0:
            continue  # already as small as a stub: replacing it cannot help
        stubs[index] = stub
        saved += saving
        if saved >= needed:
            enough = enough or (len(stubs), saved)
            # A grid position: the running saving just reached a whole number of steps (a function of
            # the prefix alone). Stop at the first one that fits.
            if saved // step > (saved - saving) // step:
                break
    else:
        if enough is not None:
            # No grid position after the first sufficient cut: the history's tail is short, so cut just
            # enough rather than stub its newest outputs too.
            count, saved = enough
            stubs = dict(list(stubs.items())[:count])
    after = total - saved
    if after > budget:
        raise ContextOverflow(
            f"the request does not fit the model's context window even with all {len(stubs)} tool "
            f"outputs truncated: estimated {after} tokens > budget {budget}; the thread needs compaction"
        )
    out = [stubs.get(index, item) for index, item in enumerate(history)]
    report = TruncationReport(len(history), len(stubs), total, after, budget, tuple(sorted(stubs)))
    return out, report


def window_budget(context_window: int, max_output_tokens: int) -> int:
    """Input tokens a request may use: the window minus room for the answer. The reserve is capped at an
    eighth of the window so that a model with a huge maximum output (64k of a 200k window) is not
    truncated long before the engine's compaction threshold (75% of the window)."""
    return context_window - min(max_output_tokens, context_window // 8)


def request_estimate(system: str, tools: Sequence[ToolSpec], history: Sequence[HistoryItem]) -> int:
    """The estimated input tokens of a request with this system prompt, tools and (untruncated) history:
    the one size both the compaction trigger and truncation measure."""
    return estimate_fixed(system, tools) + sum(map(estimate_item, history))


def compaction_limit(context_window: int, max_output_tokens: int, threshold: float) -> int:
    """The request estimate above which a thread should compact: ``threshold`` of the window, but never
    above the truncation budget, so compaction always comes before truncation."""
    return min(int(context_window * threshold), window_budget(context_window, max_output_tokens))


def compaction_helps(
    system: str,
    tools: Sequence[ToolSpec],
    history: Sequence[HistoryItem],
    context_window: int,
    max_output_tokens: int,
    threshold: float,
    *,
    scale: float = 1.0,
) -> bool:
    """Whether a thread with this next request should compact: the request is over the share
    ``threshold`` of the window — its estimate times ``scale``, the provider's tokens per estimated token
    as measured on the thread's last request — or too close to truncation's budget for a compaction
    thread to read it whole (:func:`hard_estimate`, with :data:`COMPACTION_HEADROOM`); and what compaction
    can remove — the history after its leading summary and before the inputs the model has not answered
    yet (:func:`unanswered_start`) — is at least a quarter of the room the window leaves beside the fixed
    part (system prompt and tools). The last condition keeps a window that the fixed part nearly fills
    from compacting after every turn. ``False`` when the fixed part alone does not fit
    (:func:`fixed_part_error`): no compaction can help then."""
    if context_window <= 0:
        return False
    fixed = estimate_fixed(system, tools)
    budget = window_budget(context_window, max_output_tokens)
    if fixed > budget:
        return False
    sizes = [estimate_item(item) for item in history]
    measured = (fixed + sum(sizes)) * _bounded(scale)
    hard = hard_fixed(system, tools, scale) + sum(map(hard_estimate(scale), history))
    if hard + COMPACTION_HEADROOM <= budget and measured <= min(context_window * threshold, budget):
        return False
    lead = 1 if history and isinstance(history[0], Summary) else 0
    compactable = sum(sizes[lead : unanswered_start(history)])
    return compactable >= max(1, (budget - fixed) // 4)


#: What a compaction thread adds to the history it inherits (its begin call and instructions), with
#: room to spare: compaction starts while that request still fits without truncation.
COMPACTION_HEADROOM = 256
#: The hard budget scales the estimate by the measured scale times this margin: what was added since the
#: measure may be denser than what was measured.
SCALE_MARGIN = 1.1


def _bounded(scale: float) -> float:
    """A measured scale, kept within what the estimate's known error allows (see the module docstring)."""
    return min(1.5, max(0.5, scale))


def estimate_scale(reported: int, estimated: int) -> float | None:
    """The provider's tokens per estimated token of one request (``reported`` input tokens, system and
    tools included, for ``estimated``); ``None`` when either is unknown."""
    if reported <= 0 or estimated <= 0:
        return None
    return round(_bounded(reported / estimated), 4)


def hard_factor(scale: float) -> float:
    """What the hard checks multiply an estimate by, for a thread measured at ``scale``: the scale with
    :data:`SCALE_MARGIN` (``1.0``: unmeasured, the estimate as it is)."""
    return 1.0 if scale == 1.0 else _bounded(scale * SCALE_MARGIN)


def hard_estimate(scale: float, *, covers_outputs: bool = False) -> Estimate:
    """The per-item estimate the hard checks (truncation, overflow, compaction before truncation) use on a
    thread measured at ``scale``: :func:`estimate_item` times :func:`hard_factor`, except that a tool
    output is never counted below its estimate — it may be far denser (JSON, base64) than the
    conversation the scale was measured on — unless the scale ``covers_outputs`` (they were measured)."""
    factor = hard_factor(scale)
    if factor == 1.0:
        return estimate_item

    def estimate(item: HistoryItem) -> int:
        size = estimate_item(item)
        if factor < 1.0 and not covers_outputs and isinstance(item, ToolResultItem | EventItem):
            return size
        return math.ceil(size * factor)

    return estimate


def hard_fixed(system: str, tools: Sequence[ToolSpec], scale: float = 1.0) -> int:
    """The fixed part of a request (system prompt and tools) as the hard checks count it."""
    return math.ceil(estimate_fixed(system, tools) * hard_factor(scale))


#: Inputs the model answers: the trailing run of these is what a compaction must leave verbatim.
_INPUTS = (UserItem, EventItem, ToolResultItem, ApprovalItem)


def unanswered_start(history: Sequence[HistoryItem]) -> int:
    """The index where the inputs the model has not answered yet begin: the trailing run of user items,
    events, tool results and decisions, extended back over the assistant turn whose calls those results
    answer (a result is never separated from its call, nor a call from the reasoning and text before
    it). ``len(history)`` when the history ends with the model's own output. A compaction summarises only
    what comes before: the unanswered inputs stay verbatim after the summary and are answered once."""
    start = len(history)
    while start > 0 and isinstance(history[start - 1], _INPUTS):
        start -= 1
    if start == len(history):
        return start
    needed = {i.result.id for i in history[start:] if isinstance(i, ToolResultItem)}
    needed -= {i.call.id for i in history[start:] if isinstance(i, ToolCallItem)}
    while needed and start > 0:
        start -= 1
        item = history[start]
        if isinstance(item, ToolCallItem):
            needed.discard(item.call.id)
        elif isinstance(item, ToolResultItem):
            needed.add(item.result.id)
    if start < len(history) and isinstance(history[start], ToolCallItem):
        while start > 0 and isinstance(history[start - 1], Reasoning | AssistantText):
            start -= 1
    return start


def input_room(
    system: str, tools: Sequence[ToolSpec], context_window: int, max_output_tokens: int, scale: float = 1.0
) -> int:
    """Tokens (estimated) the conversation may use beside the fixed part of every request: the
    truncation budget minus the system prompt and tools, as the hard checks count them at the thread's
    measured ``scale`` (in estimated tokens of text). ``0`` when the window is unknown."""
    if context_window <= 0:
        return 0
    room = window_budget(context_window, max_output_tokens) - hard_fixed(system, tools, scale)
    return int(room / hard_factor(scale))


def fixed_part_error(
    system: str, tools: Sequence[ToolSpec], context_window: int, max_output_tokens: int
) -> str | None:
    """The message that says the window is smaller than the fixed part of every request (system prompt,
    tool schemas and the output reserve), naming both sizes and what to change; ``None`` when it fits or
    the window is unknown."""
    if context_window <= 0 or window_budget(context_window, max_output_tokens) > estimate_fixed(
        system, tools
    ):
        return None
    prompt = ITEM_FRAMING_TOKENS + estimate_text(system)
    schemas = estimate_fixed(system, tools) - prompt
    reserve = context_window - window_budget(context_window, max_output_tokens)
    return WINDOW_TOO_SMALL.format(
        window=context_window,
        fixed=prompt + schemas + reserve,
        prompt=prompt,
        schemas=schemas,
        tools=len(tools),
        reserve=reserve,
    )


#: The error when even the fixed part of a request does not fit the window.
WINDOW_TOO_SMALL = (
    "The model's context window ({window} tokens) is smaller than the fixed part of every request (about "
    "{fixed} tokens: system prompt {prompt}, tool schemas {schemas} for {tools} tools, output reserve "
    "{reserve}), so no message can be answered. Use a model with a larger context window (or set "
    "STEPAGENT_CONTEXT_WINDOW if its real window is larger), offer fewer built-in tools "
    "(STEPAGENT_BUILTIN_TOOLS), or shorten the system prompt (STEPAGENT_SYSTEM_PROMPT)."
)
#: The error when one input alone cannot fit the room the window leaves beside the fixed part.
INPUT_TOO_LARGE = (
    "The message is too large for the model's context window: about {tokens} tokens ({chars} characters), "
    "where the window is {window} tokens and one message may take at most about {limit} of them (the rest "
    "holds the system prompt, tools and output reserve). It was not shown to the model; send it in smaller "
    "parts."
)
#: What the model (and ``history``) sees in place of an input that could not fit.
INPUT_NOT_SHOWN = (
    "[A message of {chars} characters was not shown to the model: it does not fit the context window of "
    "{window} tokens.]"
)


def _room(request: ModelRequest) -> int:
    """The request's budget beside its fixed part, as the hard checks count them."""
    budget = window_budget(request.model.context_window, request.output_limit)
    return budget - hard_fixed(request.system, request.tools, request.estimate_scale)


def compaction_first(request: ModelRequest) -> bool:
    """Whether ``request`` should wait for a compaction before it is sent: its estimate is over the
    (measured) truncation budget — sent as it is, its oldest tool outputs would be truncated — and
    compaction can remove enough of it (:func:`compaction_helps`). Compaction comes before truncation."""
    window = request.model.context_window
    if window <= 0:
        return False
    if sum(
        map(
            hard_estimate(request.estimate_scale, covers_outputs=request.estimate_scale_covers_outputs),
            request.history,
        )
    ) <= _room(request):
        return False
    return compaction_helps(
        request.system,
        request.tools,
        request.history,
        window,
        request.output_limit,
        1.0,
        scale=request.estimate_scale,
    )


def too_large_to_compact(request: ModelRequest) -> int | None:
    """When ``request`` cannot fit even truncated and no compaction can make it fit — nothing before its
    unanswered inputs can be compacted (only a summary, or nothing, precedes them), or those inputs alone
    cannot fit even truncated: the estimate of those inputs at their least (tokens). ``None`` otherwise."""
    if not overflows(request):
        return None
    history = request.history
    start = unanswered_start(history)
    lead = 1 if history and isinstance(history[0], Summary) else 0
    least = _least_of(
        hard_estimate(request.estimate_scale, covers_outputs=request.estimate_scale_covers_outputs)
    )
    run = sum(map(least, history[max(start, lead) :]))
    if start > lead and run <= _room(request):
        return None
    return run


def overflows(request: ModelRequest) -> bool:
    """Whether ``request`` cannot fit its model's window even with every tool output truncated (the
    thread must compact first). ``False`` when the window is unknown."""
    window = request.model.context_window
    if window <= 0:
        return False
    least = _least_of(
        hard_estimate(request.estimate_scale, covers_outputs=request.estimate_scale_covers_outputs)
    )
    return sum(map(least, request.history)) > _room(request)


#: What replaces the oldest items a compaction thread cannot be shown (:func:`newest_that_fit`).
OMITTED_NOTE = "[{count} earlier conversation items omitted: they did not fit the model's context window]"


def _least(item: HistoryItem) -> int:
    """An item's estimate with its tool output truncated (the least it can cost in a request)."""
    return _least_of(estimate_item)(item)


def _least_of(estimate: Estimate) -> Estimate:
    """:func:`_least` by ``estimate``."""

    def least(item: HistoryItem) -> int:
        size = estimate(item)
        if isinstance(item, ToolResultItem | EventItem):
            size = min(size, estimate(_stub(item)))
        return size

    return least


def newest_that_fit(request: ModelRequest) -> list[HistoryItem]:
    """``request.history``, or — when it cannot fit even truncated — a note followed by its newest items
    that can. For a compaction thread, which has no compaction of its own to fall back on: it summarises
    what it can see instead of failing forever."""
    history = list(request.history)
    window = request.model.context_window
    if window <= 0 or not overflows(request):
        return history
    estimate = hard_estimate(request.estimate_scale, covers_outputs=request.estimate_scale_covers_outputs)
    least = _least_of(estimate)
    budget = _room(request) - estimate(UserItem(TextContent(text=OMITTED_NOTE.format(count=len(history)))))
    start, total = len(history), 0
    while start > 0 and total + (size := least(history[start - 1])) <= budget:
        total += size
        start -= 1
    return [UserItem(TextContent(text=OMITTED_NOTE.format(count=start))), *history[start:]]


def fit_request(
    request: ModelRequest, estimate: Estimate | None = None
) -> tuple[list[HistoryItem], TruncationReport | None]:
    """The request's history, truncated once to fit its model's window; ``None`` report when the window
    is unknown (``context_window == 0``: nothing to fit against) or nothing had to change."""
    window = request.model.context_window
    if window <= 0:
        return list(request.history), None
    if estimate is None:
        estimate = hard_estimate(request.estimate_scale, covers_outputs=request.estimate_scale_covers_outputs)
    history, report = truncate_for_window(request.history, _room(request), estimate)
    if not report.rows_replaced:
        return history, None
    _log.warning(
        "request for %s over its context window: replaced %d of %d rows with stubs (estimate %d -> %d tokens, "
        "budget %d)",
        request.model.model_id,
        report.rows_replaced,
        report.rows_examined,
        report.estimate_before,
        report.estimate_after,
        report.budget,
    )
    return history, report


def annotate(event: StreamEvent, report: TruncationReport | None) -> StreamEvent:
    """``event``, with the truncation report in ``Final.extra["truncation"]`` when the request was cut."""
    if report is None or not isinstance(event, Final):
        return event
    return Final(event.usage, event.stop_reason, {**event.extra, "truncation": report.as_dict()})
