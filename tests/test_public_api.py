"""The public API is pinned: ``stepagent.__all__`` (and ``stepagent.testing.__all__``) list exactly these
names, sorted, and every one of them imports. Changing the public surface means changing this file."""

from __future__ import annotations

import importlib

import pytest

import stepagent
import stepagent.testing

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
