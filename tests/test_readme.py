"""The README's offline-testing example runs as written (its script and its test function)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from stepagent import tool

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.DOTALL)


@tool
async def get_weather(city: str, unit: str = "C") -> str:
    """Current weather for a city."""
    return f"14°{unit} in {city}"


def test_the_offline_testing_example_runs_as_written(tmp_path: Path) -> None:
    """The README's script and test file, run by plain pytest in a fresh folder (no asyncio plugin, no
    project configuration), pass."""
    script = next(block for block in _blocks("json") if '"rules"' in block)
    json.loads(script)  # the README shows valid JSON
    (tmp_path / "agent.json").write_text(script)
    code = next(block for block in _blocks("python") if "def test_my_agent" in block)
    (tmp_path / "test_agent.py").write_text(code)
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:asyncio",
            "-p",
            "no:cacheprovider",
            "-c",
            os.devnull,
            "test_agent.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 passed" in ran.stdout


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


def test_the_limits_and_structured_output_examples_run_as_written() -> None:
    """Each Python example of "Approvals, limits and structured output" (its ``### Limits`` and
    ``### Structured output`` parts) runs as written and its assertions hold."""
    section = (
        README.read_text().split("## Approvals, limits and structured output", 1)[1].split("\n## ", 1)[0]
    )
    parts = {
        name: section.split(f"### {name}", 1)[1].split("\n### ", 1)[0]
        for name in ("Limits", "Structured output")
    }
    for name, text in parts.items():
        blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
        assert blocks, f"no example in ### {name}"
        for code in blocks:
            exec(compile(code, f"README ### {name}", "exec"), {"__name__": f"readme_{name}"})
