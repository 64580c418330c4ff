"""Settings that fail closed, as a person meets them at ``stepagent run``: an approval entry that selects no
tool and a dollar limit on a model without prices stop the command before anything starts (a typo must
not quietly turn approval or the spending bound off), misspelt ``STEPAGENT_*`` names are named on stderr
whatever the logging, and every configuration error comes before the local stack is started."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from stepagent.cli import main
from tests.integration.test_cli import clean_env, stepagent

SCRIPT = {"rules": [{"when": "go", "reply": [{"tool_call": {"name": "search", "arguments": {"q": "x"}}}]}]}


def _project(tmp_path: Path) -> dict[str, str]:
    """A directory with a ``search`` tool and a scripted model; the settings that name them."""
    (tmp_path / "shop_tools.py").write_text(
        textwrap.dedent(
            '''
            from stepagent import tool

            @tool
            def search(q: str) -> str:
                """Search the catalogue."""
                return "found " + q

            @tool
            def refund(order_id: str, amount_usd: float) -> str:
                """Refund an order."""
                return "refunded"

            toolset = [search, refund]
            '''
        )
    )
    script = tmp_path / "script.json"
    script.write_text(json.dumps({**SCRIPT, "default": [{"text": "done"}]}))
    return {
        "STEPAGENT_TOOLS": "shop_tools:toolset",
        "STEPAGENT_MODEL": f"scripted:{script}",
        "PYTHONPATH": str(tmp_path),
    }


def test_an_approval_entry_that_matches_no_tool_stops_run_before_the_stack_starts(tmp_path: Path) -> None:
    env = clean_env(**_project(tmp_path), STEPAGENT_APPROVAL="serch,refund")
    result = stepagent("run", "--say", "go", env=env)
    assert result.returncode == 2, result.stderr
    assert "STEPAGENT_APPROVAL: 'serch' matches no tool" in result.stderr
    assert "did you mean search?" in result.stderr
    assert "'refund'" not in result.stderr  # the entry that does match is not reported
    assert "starting the embedded local stack" not in result.stderr
    assert "you > go" not in result.stdout  # nothing was sent, nothing ran unasked


def test_a_profile_approval_entry_that_matches_no_tool_is_an_error_too(tmp_path: Path) -> None:
    profiles = {"support": {"approval": ["refnud"]}}
    env = clean_env(**_project(tmp_path), STEPAGENT_PROFILES=json.dumps(profiles))
    result = stepagent("run", "--say", "go", env=env)
    assert result.returncode == 2, result.stderr
    assert "profile 'support': approval: 'refnud' matches no tool" in result.stderr
    assert "did you mean refund?" in result.stderr


def test_a_dollar_limit_on_a_model_without_prices_is_an_error_at_start(tmp_path: Path) -> None:
    env = clean_env(**_project(tmp_path), STEPAGENT_MAX_CONVERSATION_COST_USD="0.01")
    result = stepagent("run", "--say", "go", env=env)
    assert result.returncode == 2, result.stderr
    assert "STEPAGENT_MAX_CONVERSATION_COST_USD=$0.01 cannot be enforced" in result.stderr
    assert "STEPAGENT_PRICES" in result.stderr
    assert "starting the embedded local stack" not in result.stderr


def test_a_priced_model_keeps_its_dollar_limit(tmp_path: Path) -> None:
    project = _project(tmp_path)
    prices = {project["STEPAGENT_MODEL"]: {"input": 1.0, "output": 2.0}}
    env = clean_env(
        **project,
        STEPAGENT_MAX_CONVERSATION_COST_USD="5",
        STEPAGENT_PRICES=json.dumps(prices),
        STEPAGENT_APPROVAL="refund",
    )
    result = stepagent("run", "--say", "hello", env=env)
    assert result.returncode == 0, result.stderr
    assert "agent > done" in result.stdout


def test_an_invalid_agent_setting_is_reported_before_the_local_stack_starts(tmp_path: Path) -> None:
    env = clean_env(**_project(tmp_path), STEPAGENT_MAX_TOKENS="lots")
    result = stepagent("run", env=env)
    assert result.returncode == 2, result.stderr
    assert "STEPAGENT_MAX_TOKENS='lots' is invalid" in result.stderr
    assert "starting the embedded local stack" not in result.stderr


def test_an_unknown_setting_is_named_on_stderr_whatever_the_logging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In process, where logging goes wherever the host configured it (here: pytest's capture), the
    warning still reaches the person's stderr — once, with the closest valid name."""
    monkeypatch.setenv("STEPAGENT_MAX_MODEL_CALL_PER_TURN", "2")
    status = main(["history", "t1", "--state-dir", str(tmp_path / "nothing-here")])
    assert status == 2
    err = capsys.readouterr().err
    expected = (
        "unknown setting STEPAGENT_MAX_MODEL_CALL_PER_TURN is ignored; "
        "did you mean STEPAGENT_MAX_MODEL_CALLS_PER_TURN?"
    )
    assert err.count(expected) == 1, err
    assert err.index(expected) < err.index("holds no local state")
