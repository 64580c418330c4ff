"""What each turn spent, where a person looks: a quiet line after every turn of the terminal chat,
``stepagent usage --turns`` (one row per turn, its threads included, adding up to the total), the
console's per-turn list — and a limit message that gives the unit and the next step."""

from __future__ import annotations

import json
from pathlib import Path

from stepagent.console import pages
from stepagent.notices import limit_text
from stepagent.usage import TokenTotals, TurnUsage
from tests.console.test_pages import hostile_page
from tests.integration.test_cli import clean_env, stepagent


def _priced_demo(tmp_path: Path) -> dict[str, str]:
    script = {
        "rules": [
            {
                "when": "delegate",
                "reply": [
                    {
                        "tool_call": {
                            "name": "spawn_thread",
                            "arguments": {"instructions": "say hi", "child_of": "{thread_stack}"},
                        }
                    }
                ],
            },
            {
                "when": "INSIDE",
                "reply": [
                    {
                        "tool_call": {
                            "name": "close_thread",
                            "arguments": {"thread_id": "{thread_id}", "report_to_parent": "hi"},
                        }
                    }
                ],
            },
        ],
        "default": [{"text": "ok"}],
    }
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    model = f"scripted:{path}"
    return {"STEPAGENT_MODEL": model, "STEPAGENT_PRICES": json.dumps({model: {"input": 1.0, "output": 2.0}})}


def test_each_turn_shows_what_it_spent_and_usage_lists_the_turns(tmp_path: Path) -> None:
    env = clean_env(**_priced_demo(tmp_path))
    state = str(tmp_path / "state")
    ran = stepagent(
        "run", "--state-dir", state, "--thread", "t1", "--say", "hello", "--say", "delegate", env=env
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    quiet = [i for i, line in enumerate(lines) if line.startswith("· turn: ")]
    assert len(quiet) == 2, ran.stdout  # one after each turn
    assert lines.index("you > delegate") < quiet[1] and quiet[0] < lines.index("you > delegate")
    assert " in · " in lines[quiet[0]] and "1 model call · $" in lines[quiet[0]]

    text = stepagent("usage", "t1", "--turns", "--state-dir", state, env=env)
    assert text.returncode == 0, text.stderr
    assert (
        "  by turn:" in text.stdout
        and "    turn 1 «hello»: " in text.stdout
        and "    turn 2 «delegate»: " in text.stdout
    )
    listed = stepagent("usage", "t1", "--turns", "--json", "--state-dir", state, env=env)
    report = json.loads(listed.stdout)
    turns = report["turns"]
    assert [t["turn"] for t in turns] == [1, 2] and all(t["complete"] for t in turns)
    assert [t["text"] for t in turns] == ["hello", "delegate"]
    assert turns[0]["completions"] == 1 and turns[1]["completions"] >= 3  # the child's calls count in turn 2
    for key in ("input_tokens", "output_tokens", "completions"):
        assert sum(t[key] for t in turns) == report["total"][key]
    assert abs(sum(t["cost_usd"] for t in turns) - report["total"]["cost_usd"]) < 1e-6


def test_a_limit_says_its_unit_and_what_to_do(tmp_path: Path) -> None:
    env = clean_env(**_priced_demo(tmp_path), STEPAGENT_MAX_CONVERSATION_TOKENS="1")
    ran = stepagent("run", "--say", "hello", "--say", "again", env=env)
    assert "⏹ conversation token limit reached: " in ran.stdout, ran.stdout + ran.stderr
    assert (
        " tokens — raise STEPAGENT_MAX_CONVERSATION_TOKENS (or the profile's max_conversation_tokens)"
        in ran.stdout
    )
    assert "this conversation stays stopped until then" in ran.stdout
    cost = limit_text(
        {
            "type": "limit_reached",
            "event_id": "e",
            "limit": "conversation_cost_usd",
            "value": 0.01,
            "used": 0.011169,
        }
    )
    assert cost == (
        "conversation cost limit reached: $0.0112 of $0.01 — raise STEPAGENT_MAX_CONVERSATION_COST_USD (or the "
        "profile's max_conversation_cost_usd) to continue; this conversation stays stopped until then"
    )


def test_the_console_lists_the_usage_of_each_turn() -> None:
    page = hostile_page()
    page.turns = [
        TurnUsage(1, TokenTotals(1_200, 80, completions=1, steps=1, cost_usd=0.0013), True, "hi"),
        TurnUsage(2, TokenTotals(300, 20, completions=2, steps=2), False),
    ]
    html = pages.conversation_fragment(page, "tok")
    assert "usage per turn" in html
    assert "turn 1 «hi»: 1,200 in, 80 out, 1 call, $0.0013" in html
    assert "turn 2 (in progress): 300 in, 20 out, 2 calls" in html
