"""Token estimate and one-pass truncation of overflowing tool outputs, and its wiring in the providers."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random

import httpx
import pytest

from stepagent.errors import ProviderError
from stepagent.history_items import (
    AssistantText,
    EventItem,
    HistoryItem,
    ToolCallItem,
    ToolResultItem,
    UserItem,
)
from stepagent.messages import ImageBlock, TextBlock, TextContent, ToolCall, ToolResult
from stepagent.providers.anthropic import AnthropicProvider
from stepagent.providers.base import Final, ModelInfo, ModelRequest
from stepagent.providers.window import (
    IMAGE_TOKENS,
    TRUNCATED_STUB,
    compaction_helps,
    compaction_limit,
    estimate_fixed,
    estimate_item,
    estimate_scale,
    estimate_text,
    fit_request,
    hard_estimate,
    newest_that_fit,
    overflows,
    truncate_for_window,
    window_budget,
)


def user(text: str) -> UserItem:
    return UserItem(TextContent(text=text))


def result(call_id: str, text: str) -> ToolResultItem:
    return ToolResultItem(ToolResult.text(call_id, text))


def pair(call_id: str, text: str) -> list[HistoryItem]:
    return [ToolCallItem(ToolCall(id=call_id, name="t", arguments={})), result(call_id, text)]


def test_estimate_text_is_bytes_over_three() -> None:
    assert estimate_text("") == 0
    assert estimate_text("abc") == 1
    assert estimate_text("abcd") == 2
    assert estimate_text("😀") == 2  # 4 bytes
    assert estimate_text("日本語") == 3  # 9 bytes


def test_estimate_counts_images_and_framing() -> None:
    item = ToolResultItem(ToolResult(id="a", content=[TextBlock(text="abc"), ImageBlock(data="x" * 10_000)]))
    assert estimate_item(item) == 8 + 1 + IMAGE_TOKENS


def test_fits_already_replaces_nothing() -> None:
    history = [user("hi"), *pair("a", "small")]
    out, report = truncate_for_window(history, 10_000)
    assert out == history
    assert (report.rows_examined, report.rows_replaced) == (3, 0)


def test_oldest_tool_outputs_go_first_never_user_text() -> None:
    history: list[HistoryItem] = [
        user("u" * 30_000),  # the biggest row, but user text is never touched
        *pair("old", "s" * 3_000),
        *pair("big", "b" * 60_000),
        *pair("new", "m" * 30_000),
        AssistantText("a" * 3_000),
    ]
    total = sum(estimate_item(i) for i in history)
    out, report = truncate_for_window(history, total - 15_000)
    # Oldest first: the cut covers "old" and then "big" (enough); "new" and the user text stay whole.
    assert report.replaced_positions == (2, 4)
    replaced = out[4]
    assert isinstance(replaced, ToolResultItem)
    assert replaced.result.joined_text() == TRUNCATED_STUB.format(chars=60_000)
    assert replaced.result.id == "big"
    assert out[0] == history[0] and out[6] == history[6]
    assert report.estimate_after == sum(estimate_item(i) for i in out) <= total - 15_000


def conversation_requests(turns: int, budget: int) -> list[tuple[int, ...]]:
    """The positions truncation stubs in each request of a growing tool-using conversation."""
    history: list[HistoryItem] = []
    cuts: list[tuple[int, ...]] = []
    for turn in range(turns):
        history += [user(f"question {turn} " + "q" * 200), *pair(f"c{turn}", f"{turn} " + "r" * 2_000)]
        cuts.append(truncate_for_window(history, budget)[1].replaced_positions)
        history.append(AssistantText("answer " + "a" * 1_000))
        cuts.append(truncate_for_window(history, budget)[1].replaced_positions)
    return cuts


def test_cut_moves_in_stable_steps_so_the_prefix_rarely_changes() -> None:
    """The cache point: once made, a cut stays where it is (every later request stubs at least the same
    rows, so the stubbed prefix is byte-identical), and it moves only about once per step of growth —
    not at every request, as "just enough" truncation does."""
    budget = 24_000
    cuts = conversation_requests(40, budget)
    truncated = [c for c in cuts if c]
    assert len(truncated) > 30  # the conversation outgrew the budget halfway
    for earlier, later in itertools.pairwise(truncated):
        assert set(earlier) <= set(later), "a cut moved back or stubbed a different prefix"
        assert later[: len(earlier)] == earlier
    changes = sum(1 for earlier, later in itertools.pairwise(truncated) if earlier != later)
    # Each turn adds ~1,100 estimated tokens; a step is a quarter of the budget (6,000 tokens, about nine
    # tool outputs): the cut moves about every fifth turn instead of at every request.
    assert changes <= len(truncated) // 5
    # Stateless: the same history gives the same cut in any process.
    assert conversation_requests(40, budget) == cuts


def test_event_results_are_candidates_too() -> None:
    event = EventItem(result=ToolResult.text("ev", "e" * 90_000), tool_call_id="orig")
    out, report = truncate_for_window([user("hi"), event], 1_000)
    assert report.rows_replaced == 1
    stubbed = out[1]
    assert isinstance(stubbed, EventItem) and stubbed.tool_call_id == "orig"
    assert stubbed.result.joined_text() == TRUNCATED_STUB.format(chars=90_000)


def test_cannot_fit_raises_non_retryable() -> None:
    history = [user("u" * 90_000), *pair("a", "x" * 9_000)]
    with pytest.raises(ProviderError) as caught:
        truncate_for_window(history, 1_000)
    assert not caught.value.retryable
    assert "compaction" in str(caught.value)


@pytest.mark.parametrize("rows", [100, 1_000, 5_000])
def test_one_pass_each_row_estimated_once(rows: int) -> None:
    """Work, not time: the estimate runs once per original row (plus once per stub made), whatever the
    number of rows replaced — a per-candidate re-estimate of the request would be quadratic."""
    rng = random.Random(rows)
    history: list[HistoryItem] = [user("start")]
    for index in range(rows):
        history.extend(pair(f"c{index}", "z" * rng.randint(100, 5_000)))
    calls: list[HistoryItem] = []

    def counting(item: HistoryItem) -> int:
        calls.append(item)
        return estimate_item(item)

    total = sum(estimate_item(i) for i in history)
    out, report = truncate_for_window(history, total // 2, counting)
    row_ids = {id(h) for h in history}
    originals = [c for c in calls if id(c) in row_ids]
    assert len(originals) == len(history) == report.rows_examined
    assert len({id(c) for c in originals}) == len(history), "a row was estimated twice"
    candidates = sum(isinstance(i, ToolResultItem) for i in history)
    assert len(history) + report.rows_replaced <= len(calls) <= len(history) + candidates
    assert report.rows_replaced > rows // 10
    assert sum(estimate_item(i) for i in out) == report.estimate_after <= total // 2


def test_deterministic_oldest_first() -> None:
    history = [user("x"), *pair("a", "q" * 9_000), *pair("b", "q" * 9_000)]
    total = sum(estimate_item(i) for i in history)
    _, first = truncate_for_window(history, total - 100)
    _, second = truncate_for_window(history, total - 100)
    assert first.replaced_positions == second.replaced_positions == (2,)


def test_budget_reserve_is_capped() -> None:
    assert window_budget(200_000, 64_000) == 175_000
    assert window_budget(200_000, 4_096) == 195_904


def test_unknown_window_never_truncates() -> None:
    info = ModelInfo("m", context_window=0)
    request = ModelRequest(system="", history=[*pair("a", "x" * 3_000_000)], tools=[], model=info)
    history, report = fit_request(request)
    assert report is None and history == request.history


async def test_provider_truncates_once_and_reports_it() -> None:
    info = ModelInfo("claude-x", context_window=50_000, max_output_tokens=4_096)
    history = [user("read the log"), *pair("big", "L" * 300_000), user("and?")]
    bodies: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        sse = (
            b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":5}}}\n\n'
            b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
        )
        return httpx.Response(200, content=sse)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    provider = AnthropicProvider("claude-x", api_key="k", info=info, http_client=client)
    request = ModelRequest(system="s", history=history, tools=[], model=info)
    events = [e async for e in provider.stream(request)]
    final = events[-1]
    assert isinstance(final, Final)
    assert final.extra["truncation"]["rows_replaced"] == 1
    body = json.loads(bodies[0])
    tool_result = body["messages"][2]["content"][0]
    assert tool_result["content"] == [{"type": "text", "text": TRUNCATED_STUB.format(chars=300_000)}]
    assert body["messages"][2]["content"][1]["text"] == "and?"
    assert len(bodies[0]) < 10_000


def test_compaction_limit_never_exceeds_the_truncation_budget() -> None:
    assert compaction_limit(16_000, 1_024, 0.75) == 12_000
    assert compaction_limit(16_000, 1_024, 1.0) == window_budget(16_000, 1_024)  # compaction still first


def test_overflow_is_judged_with_every_tool_output_truncated() -> None:
    info = ModelInfo("m", context_window=4_000, max_output_tokens=500)
    truncatable = ModelRequest(
        system="s", history=[*pair("a", "x" * 30_000), user("q")], tools=[], model=info
    )
    assert not overflows(truncatable)  # the tool output can be stubbed
    too_long = ModelRequest(system="s", history=[user("u" * 30_000)], tools=[], model=info)
    assert overflows(too_long)
    assert not overflows(
        ModelRequest(system="s", history=[user("u" * 30_000)], tools=[], model=ModelInfo("m"))
    )


def test_a_compaction_thread_is_shown_the_newest_part_that_fits() -> None:
    info = ModelInfo("m", context_window=4_000, max_output_tokens=500)
    history: list[HistoryItem] = [user(f"{n} " + "u" * 3_000) for n in range(10)]
    request = ModelRequest(system="s", history=history, tools=[], model=info)
    shown = newest_that_fit(request)
    assert isinstance(shown[0], UserItem) and shown[0].text is not None
    assert shown[0].text.startswith(f"[{len(history) - len(shown) + 1} earlier conversation items omitted")
    assert shown[1:] == history[len(history) - len(shown) + 1 :]  # the newest, unchanged
    assert not overflows(dataclasses.replace(request, history=shown))
    fits = ModelRequest(system="s", history=history[:2], tools=[], model=info)
    assert newest_that_fit(fits) == history[:2]


def test_a_prose_conversation_compacts_at_the_threshold_of_the_measured_window_not_at_half() -> None:
    """English prose is ~4 bytes a token where the estimate counts 3: measured on the thread's last
    request (scale 0.75), the trigger fires where the provider's count crosses 75% of the window."""
    window, output, threshold, scale = 16_000, 1_024, 0.75, 0.75
    turn = "The measured value stays within the documented tolerance band, as the report says. " * 12

    def first_trigger(scale: float) -> float:
        """The provider's count (estimate x the true 0.75) of the history when compaction first fires."""
        history: list[HistoryItem] = []
        while True:
            history += [UserItem(TextContent(text=turn)), AssistantText(text=turn)]
            if compaction_helps("system", [], history, window, output, threshold, scale=scale):
                estimate = estimate_fixed("system", []) + sum(map(estimate_item, history))
                return estimate * 0.75 / window

    assert abs(first_trigger(scale) - threshold) <= 0.1 * threshold  # within 10% of the configured share
    assert first_trigger(1.0) < 0.6  # unmeasured: the estimate alone fires near half of the real window
    # The hard budget keeps a margin over the measure and room for the compaction thread's request.
    prose, output_item = UserItem(TextContent(text=turn)), ToolResultItem(ToolResult.text("c", "{}" * 2_000))
    assert hard_estimate(scale)(prose) == math.ceil(estimate_item(prose) * scale * 1.1)
    assert hard_estimate(scale)(output_item) == estimate_item(output_item)  # may be denser than prose
    assert estimate_scale(reported=750, estimated=1_000) == 0.75
    assert estimate_scale(reported=0, estimated=1_000) is None
