"""The threads the release corpus holds: one agent (a scripted model, three function tools) and, for each
point a thread can wait at across a deploy, a thread left there and what it must end with.

Shared by the recorder (:mod:`tests.corpus.record`, run on the previous release's code) and the tests that
continue the recorded threads with today's code (:mod:`tests.corpus.test_corpus`), so both agree on the
agent. Uses only APIs every release so far has had (it is imported by an older ``stepagent``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepagent.tools.functions import tool


@tool
def lookup(topic: str) -> str:
    """Data on a topic.

    Args:
        topic: The topic.
    """
    return f"Data on {topic}: 42"


@tool
def transfer(amount: int) -> str:
    """Transfer money (needs a person's approval).

    Args:
        amount: How much.
    """
    return f"Transferred {amount}"


@tool
def big_payload(size: int) -> str:
    """A result of ``size`` characters (claim-checked on the queue and in the stores)."""
    return "y" * size


TOOLS = [lookup, transfer, big_payload]
TOOLS_SPEC = "tests.corpus.scenarios:TOOLS"
#: Settings of the corpus agent besides the stack's resources.
AGENT_ENV = {"STEPAGENT_APPROVAL": "transfer", "STEPAGENT_TOOLS": TOOLS_SPEC}

SCRIPT: dict[str, Any] = {
    "rules": [
        {
            "when": "^look up",
            "on": ["user"],
            "reply": [
                {"text": "Looking."},
                {"tool_call": {"name": "lookup", "arguments": {"topic": "tides"}}},
            ],
        },
        {"when": "^Data on tides", "on": ["tool_result"], "reply": [{"text": "Tides: 42."}]},
        {
            "when": "^pay",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "transfer", "arguments": {"amount": 10}}}],
        },
        {"when": "^Transferred 10", "on": ["tool_result"], "reply": [{"text": "Paid."}]},
        {
            "when": "^nap",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "sleep", "arguments": {"seconds": 1}}}],
        },
        {
            "when": "^hibernate",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "sleep", "arguments": {"seconds": 7200}}}],
        },
        {"when": "^Slept for", "on": ["tool_result"], "reply": [{"text": "Awake."}]},
        {
            "when": "^big",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "big_payload", "arguments": {"size": 260000}}}],
        },
        {"when": "^y{1000}", "on": ["tool_result"], "reply": [{"text": "Got the big one."}]},
        {
            "when": "^delegate",
            "on": ["user"],
            "reply": [
                {"text": "Delegating."},
                {
                    "tool_call": {
                        "name": "spawn_thread",
                        "arguments": {"instructions": "research", "child_of": "{thread_stack}"},
                    }
                },
            ],
        },
        {"when": "successfully spawned", "reply": [{"text": "Spawned a child."}]},
        {
            "when": "You are now INSIDE",
            "reply": [{"tool_call": {"name": "lookup", "arguments": {"topic": "the child's question"}}}],
        },
        {
            "when": "^Data on the child's question",
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
    ],
    "default": [{"text": "ok"}],
}

#: A second agent whose tiny context window makes every thread compact after a few turns.
COMPACTION_SCRIPT: dict[str, Any] = {
    "context_window": 8000,
    "rules": [
        {
            "when": "INSIDE a compaction thread",
            "reply": [
                {
                    "tool_call": {
                        "name": "close_thread",
                        "arguments": {
                            "thread_id": "{thread_id}",
                            "report_to_parent": "Summary: turns counted.",
                        },
                    }
                }
            ],
        },
        {"when": "^turn", "on": ["user"], "reply": [{"text": "noted " + "n" * 6000}]},
    ],
    "default": [{"text": "ok"}],
}


@dataclass(frozen=True)
class Waiting:
    """A thread left at one waiting point: its id, the user text that leads there, and a text its history
    must hold once it has been driven to the end."""

    point: str
    thread: str
    say: str
    ends_with: str


#: The threads of the main agent, each left where its ``point`` says.
WAITING = (
    Waiting("queued tool", "corpus-tool", "look up the tides", "Tides: 42."),
    Waiting("approval", "corpus-approval", "pay the bill", "Paid."),
    Waiting("short timer (delay queue)", "corpus-nap", "nap a second", "Awake."),
    Waiting("long timer (scheduled)", "corpus-hibernate", "hibernate two hours", "Awake."),
    Waiting("child thread", "corpus-parent", "delegate the research", "Got the report."),
    Waiting("claim-checked tool result", "corpus-big", "big result please", "Got the big one."),
)
#: The thread of the compaction agent, left with a compaction running.
COMPACTING = Waiting("mid-compaction", "corpus-compacting", "turn", "noted")
