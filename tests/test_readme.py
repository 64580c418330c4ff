"""The README's offline-testing example runs as written (its script and its test function)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from stepagent import tool
from stepagent.core.history import HistoryManager
from stepagent.history_items import AssistantText

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.DOTALL)


@tool
async def get_weather(city: str, unit: str = "C") -> str:
    """Current weather for a city."""
    return f"14°{unit} in {city}"


async def test_the_scripted_model_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = next(block for block in _blocks("json") if '"rules"' in block)
    (tmp_path / "agent.json").write_text(script)
    json.loads(script)  # the README shows valid JSON
    code = next(block for block in _blocks("python") if "async def test_my_agent" in block)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"get_weather": get_weather}
    exec(code, namespace)  # the README's imports and test function, verbatim
    captured: dict[str, Any] = {}
    original = namespace["memory_stores"]

    def remembering_stores() -> Any:
        captured["stores"] = original()
        return captured["stores"]

    namespace["memory_stores"] = remembering_stores
    await namespace["test_my_agent"]()
    conversation, state = captured["stores"]
    history = (await HistoryManager.load(conversation, state, "t1")).history
    assert history[-1] == AssistantText("It is mild in Paris.")


def test_the_ownership_map_names_every_package_and_module() -> None:
    """The README's "Where each behaviour lives" table covers the package's whole top level, and nothing
    that no longer exists."""
    section = README.read_text().split("### Where each behaviour lives", 1)[1].split("\n## ", 1)[0]
    first_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    mapped = {name for cell in first_cells for name in re.findall(r"`([^`]+)`", cell)}
    package = README.parent / "src" / "stepagent"
    present = {p.name + "/" for p in package.iterdir() if (p / "__init__.py").exists()}
    present |= {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    roots = {name for name in mapped if (README.parent / name.rstrip("/")).is_dir()}
    assert mapped - roots == present
