"""stepagent.testing runs a whole conversation in one call, with a script or a Python function as the
model, and gives a transcript to assert on. These tests are synchronous on purpose: the API needs no
asyncio plugin."""

from __future__ import annotations

import pytest

from stepagent import tool
from stepagent.testing import Call, ConversationFailed, ModelTurn, Transcript, run_conversation


@tool
def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city.
    """
    return f"Sunny in {city}"


SCRIPT = {
    "rules": [
        {"when": "weather in (\\w+)", "on": ["user"],
         "reply": [{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"when": "^Sunny", "on": ["tool_result"], "reply": [{"text": "It is sunny in Paris."}]},
    ],
    "default": [{"text": "I did not understand."}],
}  # fmt: skip


def test_a_scripted_conversation_with_a_tool() -> None:
    transcript = run_conversation(["weather in Paris?", "thanks"], model=SCRIPT, tools=[get_weather])
    assert transcript.tool_calls("get_weather") == [{"city": "Paris"}]
    assert transcript.tool_results("get_weather") == ["Sunny in Paris"]
    assert transcript.texts() == ["It is sunny in Paris.", "I did not understand."]
    assert transcript.reply == "I did not understand."
    assert [i["kind"] for i in transcript.of()] == [
        "user",
        "tool_call",
        "tool_result",
        "assistant",
        "user",
        "assistant",
    ]


def test_a_python_function_as_the_model_drives_a_child_thread() -> None:
    seen: list[tuple[str, str]] = []

    def model(turn: ModelTurn) -> str | Call | list[str | Call]:
        seen.append((turn.last_kind, turn.last_input[:30]))
        if len(turn.thread_stack) > 1:  # inside the child, which starts with its instructions
            if "You are now INSIDE" in turn.last_input:
                return Call("close_thread", {"thread_id": turn.thread_id, "report_to_parent": "42"})
            return "closing"
        if turn.last_kind == "user":
            return [
                "Delegating.",
                Call("spawn_thread", {"instructions": "compute", "child_of": turn.thread_stack}),
            ]
        if "has shut down" in turn.last_input:
            return "The child says 42."
        return "waiting"

    transcript = run_conversation("compute it", model=model, thread_id="root-1")
    assert transcript.reply == "The child says 42."
    assert len(transcript.threads) == 2 and transcript.threads[0] == "root-1"
    assert transcript.tool_calls("close_thread")[0]["report_to_parent"] == "42"
    assert seen[0] == ("user", "compute it")


def test_the_same_conversation_gives_the_same_transcript() -> None:
    def run() -> Transcript:
        return run_conversation(["weather in Paris?"], model=SCRIPT, tools=[get_weather])

    assert run().items == run().items


def test_a_failing_model_raises_with_the_thread_and_the_transcript() -> None:
    def broken(turn: ModelTurn) -> str:
        raise RuntimeError("the model is down")

    with pytest.raises(ConversationFailed, match=r"thread conversation: .*the model is down"):
        run_conversation("hello", model=broken)
    kept = run_conversation("hello", model=broken, raise_on_error=False)
    assert kept.errors and kept.reply == ""
