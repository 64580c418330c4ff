"""The seam holds: in ``core/``, only ``core/effects.py`` writes a store, sends, runs a tool or commits the
history (``HistoryManager.sync`` is the commit's single writer), and tools are given no raw store.

The store write methods are derived from the port protocols (every method not listed as a read), so a new
write method is covered without touching this test. The check reads the source (every path, not only the
ones a scenario exercises); a second test runs a crash-matrix scenario and looks at who really called.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
from pathlib import Path
from typing import Any

import pytest

from stepagent.core import effects
from stepagent.stores.base import ConversationStore, StateStore
from stepagent.tools.base import ToolAccess, ToolContext
from tests.reliability import scenarios
from tests.reliability.faults import CrashPlan
from tests.reliability.scenarios import SCENARIOS, run_memory

CORE = Path(effects.__file__).parent
SEAM = "effects.py"

#: Store methods that only read (everything else on the two protocols is a write).
READS = {
    "get_thread",
    "load_rows",
    "children",
    "latest_summary",
    "usage_records",
    "filter_processed",
    "filter_answered",
    "get_metadata",
    "active_subscriptions",
    "pending_choices",
    "open_intents",
    "deferred_inputs",
    "indexed_call",
    "cache_get",
}
#: Writes a thread's step owns: no tool may reach them.
STEP_OWNED = {
    "commit",
    "rewind",
    "stage_history",
    "sweep_generations",
    "mark_processed",
    "mark_intent_done",
    "set_metadata",
    "add_pending_choice",
    "remove_pending_choice",
    "claim_compaction",
    "release_compaction",
}


def protocol_methods(protocol: type) -> set[str]:
    return {
        name
        for name, member in vars(protocol).items()
        if not name.startswith("_") and inspect.isfunction(member)
    }


STORE_METHODS = protocol_methods(ConversationStore) | protocol_methods(StateStore)
STORE_WRITES = STORE_METHODS - READS


def receiver(node: ast.expr) -> str:
    return ast.unparse(node)


def violations(source: str, module: str) -> list[str]:
    """Every write in ``source`` (a module of ``core/`` named ``module``) that belongs in the seam."""
    found: list[str] = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            name, target = node.func.attr, receiver(node.func.value)
            where = f"{module}:{node.lineno} {target}.{name}()"
            if target.split(".")[-1] in {"effects", "_effects"}:
                continue  # asking the seam is how the phases write
            if name in STORE_WRITES and target.split(".")[-1] != "history":
                # HistoryManager's own pending-change methods share some names; they write nothing.
                if not (module == "history.py" and function.name == "sync" and name == "commit"):
                    found.append(where)
            elif name == "sync" or (name == "send" and target.endswith("sender")) or name == "execute":
                found.append(where)
    return found


def test_only_the_seam_writes_from_core() -> None:
    found = [
        problem
        for path in sorted(CORE.glob("*.py"))
        if path.name != SEAM
        for problem in violations(path.read_text(), path.name)
    ]
    assert not found, f"writes outside core/{SEAM}: {found}"


def test_the_check_catches_a_direct_write_in_the_step() -> None:
    """The check is not vacuous: a store write, a commit, a send or a tool run added to step.py is found."""
    step = (CORE / "step.py").read_text()
    assert violations(step, "step.py") == []
    added = (
        "\n\nasync def sneaky(self, history, tool):\n"
        "    await self.state.mark_intent_done(self.thread_id, 'x')\n"
        "    await self.conversation.spawn_thread('p', child_id='c', spawn_tool_call_id='x', kind=None)\n"
        "    await history.sync()\n"
        "    await self.config.sender.send(None, 'x')\n"
        "    await tool.execute({}, None)\n"
    )
    assert len(violations(step + added, "step.py")) == 5
    assert violations("def f(c):\n    return c.commit(1)\n", "history.py") == ["history.py:2 c.commit()"]


def test_reads_are_store_methods_and_writes_exist() -> None:
    assert READS <= STORE_METHODS  # a renamed read must not silently become unchecked
    assert {"commit", "spawn_thread", "mark_intent_done", "add_pending_choice"} <= STORE_WRITES


def test_tools_get_a_capability_without_the_steps_writes() -> None:
    fields = {f.name for f in dataclasses.fields(ToolContext)}
    assert not fields & {"conversation", "state"}
    offered = protocol_methods(ToolAccess)
    assert offered and not offered & STEP_OWNED
    assert offered <= STORE_METHODS  # the capability only narrows the stores
    implemented = {name for name in vars(effects.StoreToolAccess) if not name.startswith("_")}
    assert implemented == offered


# ---- the same, observed: who calls the stores' write methods while the threads run --------------------------


class CallerRecorder:
    """Wraps a store: records, for every write, the innermost ``stepagent`` frame that called it."""

    def __init__(self, inner: Any, callers: list[str]) -> None:
        self._inner = inner
        self._callers = callers

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in STORE_WRITES or not inspect.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            frame = sys._getframe(1)
            while frame is not None and "/stepagent/" not in frame.f_code.co_filename:
                frame = frame.f_back
            if frame is not None:
                path = Path(frame.f_code.co_filename)
                self._callers.append(f"{path.parent.name}/{path.name}:{frame.f_code.co_name}")
            return await attr(*args, **kwargs)

        return call


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_a_run_writes_the_stores_only_through_the_seam(name: str, monkeypatch: Any) -> None:
    """Run a crash-matrix scenario with its stores wrapped: every write made on behalf of ``core/`` or a
    tool comes from the seam (or the history's own commit), never from the step's phases or a tool."""
    callers: list[str] = []
    real = scenarios.Faulty

    def faulty(inner: Any, plan: CrashPlan, label: str) -> Any:
        wrapped = CallerRecorder(inner, callers) if label in {"conversation", "state"} else inner
        return real(wrapped, plan, label)

    monkeypatch.setattr(scenarios, "Faulty", faulty)
    await run_memory(SCENARIOS[name])
    engine = [c for c in callers if c.split("/")[0] in {"core", "tools"}]
    assert engine, "the scenario wrote nothing through core/"
    stray = {c for c in engine if not (c.startswith("core/effects.py") or c == "core/history.py:sync")}
    assert not stray, stray
