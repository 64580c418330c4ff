"""The public API is pinned: ``stepagent.__all__``, ``stepagent.client.__all__``,
``stepagent.testing.__all__`` and ``stepagent.rap.server.__all__`` list exactly these names, sorted, every
one of them imports, and the README's "Public API" table names each of them — removing or renaming a
public name fails here. Changing the public surface means changing this file."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import stepagent
import stepagent.testing

README = Path(__file__).resolve().parents[1] / "README.md"

PUBLIC = ["AgentConfig", "AgentProfile", "AgentSystem", "InputMessage", "LocalAgentSystem", "tool"]
TESTING = [
    "Call",
    "ConversationFailed",
    "FunctionModelProvider",
    "InProcessQueueDriver",
    "ModelTurn",
    "Transcript",
    "arun_conversation",
    "run_conversation",
]


def test_the_public_names_are_pinned_and_sorted() -> None:
    assert sorted(PUBLIC) == PUBLIC
    assert stepagent.__all__ == PUBLIC
    assert sorted(TESTING) == TESTING
    assert stepagent.testing.__all__ == TESTING


@pytest.mark.parametrize(
    ("module", "name"), [("stepagent", n) for n in PUBLIC] + [("stepagent.testing", n) for n in TESTING]
)
def test_every_public_name_imports(module: str, name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {module} import {name}", namespace)  # the import statement users write
    assert namespace[name] is getattr(importlib.import_module(module), name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = stepagent.Nope  # type: ignore[attr-defined]


CLIENT = ["Client", "ClientError", "Cursor", "Item", "SyncClient"]


def test_the_client_names_are_pinned_and_import() -> None:
    import stepagent.client

    assert sorted(CLIENT) == CLIENT
    assert stepagent.client.__all__ == CLIENT
    for name in CLIENT:
        namespace: dict[str, object] = {}
        exec(f"from stepagent.client import {name}", namespace)
        assert namespace[name] is getattr(stepagent.client, name)


RAP_SERVER = [
    "DEFERRED",
    "CallbackError",
    "RapCall",
    "RapToolServer",
    "Result",
    "Subscription",
    "current_call",
    "serve_in_background",
]
# Public names that live in a module whose other names are internal: (module, name).
SINGLES = [("stepagent.errors", "ToolError"), ("stepagent.aws.settings", "Settings")]


def test_the_remote_tool_server_names_are_pinned_and_import() -> None:
    import stepagent.rap.server

    assert stepagent.rap.server.__all__ == RAP_SERVER
    for name in RAP_SERVER:
        namespace: dict[str, object] = {}
        exec(f"from stepagent.rap.server import {name}", namespace)
        assert namespace[name] is getattr(stepagent.rap.server, name)


@pytest.mark.parametrize(("module", "name"), SINGLES)
def test_the_tool_error_and_the_settings_import(module: str, name: str) -> None:
    assert isinstance(getattr(importlib.import_module(module), name), type)


def _readme_table() -> dict[str, set[str]]:
    """The README's "Public API" table: module → the names its row lists."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Public API", 1)[1].split("\n## ", 1)[0]
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) == 4 and cells[1].strip().startswith("`stepagent"):
            module = re.match(r"\s*`([\w.]+)`", cells[1])
            assert module is not None
            table[module.group(1)] = set(re.findall(r"`(\w+)`", cells[2]))
    return table


def test_the_readme_names_every_public_name_and_no_other() -> None:
    table = _readme_table()
    expected = {
        "stepagent": set(PUBLIC),
        "stepagent.client": set(CLIENT),
        "stepagent.testing": set(TESTING),
        "stepagent.rap.server": set(RAP_SERVER),
    }
    for module, name in SINGLES:
        expected.setdefault(module, set()).add(name)
    assert set(table) == set(expected)
    for module, names in expected.items():
        # the settings row also names `from_env`, a method of the public class
        assert names <= table[module], (module, names - table[module])
        assert table[module] - names <= {"from_env"}, (module, table[module] - names)
