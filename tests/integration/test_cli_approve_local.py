"""``stepagent approve`` on the embedded stack, as a person follows ``run --say``'s hint: the call left waiting
in ``--state-dir D`` is decided with the command the hint names; a refused edit exits 1 with the reason
and changes nothing; the accepted decision runs the call and the agent continues, all printed."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

from tests.integration.test_cli import clean_env, stepagent


def _project(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "shop_tools.py").write_text(
        textwrap.dedent(
            '''
            from stepagent import tool

            @tool
            def refund(order_id: str, amount_usd: float) -> str:
                """Refund an order."""
                return f"refunded {amount_usd} on {order_id}"
            '''
        )
    )
    script = {
        "rules": [
            {"when": "refunded", "reply": [{"text": "Refund done."}]},
            {
                "when": "refund",
                "reply": [
                    {"tool_call": {"name": "refund", "arguments": {"order_id": "A-17", "amount_usd": 5}}}
                ],
            },
        ],
        "default": [{"text": "ok"}],
    }
    (tmp_path / "script.json").write_text(json.dumps(script))
    return {
        "STEPAGENT_TOOLS": "shop_tools:refund",
        "STEPAGENT_MODEL": f"scripted:{tmp_path / 'script.json'}",
        "STEPAGENT_APPROVAL": "refund",
        "PYTHONPATH": str(tmp_path),
    }


def test_approve_decides_a_call_left_waiting_in_a_state_dir(tmp_path: Path) -> None:
    env = clean_env(**_project(tmp_path))
    state = str(tmp_path / "state")
    ran = stepagent("run", "--state-dir", state, "--thread", "shop-1", "--say", "refund order A-17", env=env)
    assert ran.returncode == 0, ran.stderr
    hint = re.search(r"`(stepagent approve shop-1 (\S+) --state-dir \S+)`", ran.stdout)
    assert hint is not None, ran.stdout
    assert hint.group(1) == f"stepagent approve shop-1 {hint.group(2)} --state-dir {state}"
    call = hint.group(2)

    refused = stepagent(
        "approve",
        "shop-1",
        call,
        "--state-dir",
        state,
        "--edit",
        '{"order_id": "A-17", "amount_usd": "lots"}',
        env=env,
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "the decision was refused" in refused.stderr and "amount_usd" in refused.stderr

    approved = stepagent("approve", "shop-1", call, "--state-dir", state, env=env)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert f"sent approve for refund ({call})" in approved.stdout
    assert "✔ approved" in approved.stdout and "agent > Refund done." in approved.stdout

    again = stepagent("approve", "shop-1", call, "--state-dir", state, env=env)
    assert again.returncode == 1 and "already decided" in again.stderr

    listed = stepagent("history", "shop-1", "--state-dir", state, env=env)
    assert listed.returncode == 0, listed.stderr
    assert "⚙ refund(" in listed.stdout and "✔ approved" in listed.stdout
    assert "HTTP/1.1" not in listed.stderr, listed.stderr  # no access log of the embedded moto server
    assert listed.stderr.count("\n") <= 3, listed.stderr


def test_run_without_a_state_dir_does_not_name_a_command_that_cannot_work(tmp_path: Path) -> None:
    env = clean_env(**_project(tmp_path))
    ran = stepagent("run", "--thread", "shop-2", "--say", "refund order A-17", env=env)
    assert ran.returncode == 0, ran.stderr
    assert "--state-dir DIR" in ran.stdout and "echo y | stepagent run" in ran.stdout
    assert not re.search(r"`stepagent approve shop-2 \S+`", ran.stdout)
