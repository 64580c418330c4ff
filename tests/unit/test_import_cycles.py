"""No two files of stepagent import each other, counting imports inside functions and under TYPE_CHECKING.

``make lint`` runs the same check as an import-linter contract (``acyclic_modules``,
``tests/import_contracts.py``); here it also runs with the tests, and on a small package written for the
purpose, to show that an import made only inside a function closes a cycle too.
"""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

from tests.import_contracts import AcyclicModulesContract, module_cycles


def test_no_two_modules_of_stepagent_or_the_handlers_import_each_other() -> None:
    graph = grimp.build_graph("stepagent", "handlers", include_external_packages=True, cache_dir=None)
    assert module_cycles(graph, "stepagent") == []
    assert module_cycles(graph, "handlers") == []


@pytest.fixture
def lazy_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> grimp.ImportGraph:
    """``cyclepkg/__init__.py`` imports ``cyclepkg.tracer`` only inside a function; ``cyclepkg.tracer``
    imports a name from the package at its top; ``cyclepkg.leaf`` is imported by both and imports nothing."""
    package = tmp_path / "cyclepkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from cyclepkg.leaf import VALUE\n\nSWITCH = True\n\n\n"
        "def make():\n    from cyclepkg.tracer import Tracer\n\n    return Tracer()\n"
    )
    (package / "tracer.py").write_text(
        "from cyclepkg import SWITCH\nfrom cyclepkg.leaf import VALUE\n\n\nclass Tracer:\n    on = SWITCH\n"
    )
    (package / "leaf.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return grimp.build_graph("cyclepkg", cache_dir=None)


def test_an_import_inside_a_function_closes_a_cycle(lazy_cycle: grimp.ImportGraph) -> None:
    assert module_cycles(lazy_cycle, "cyclepkg") == [["cyclepkg", "cyclepkg.tracer"]]


def test_the_lint_contract_is_broken_by_that_cycle_and_names_each_import(
    lazy_cycle: grimp.ImportGraph,
) -> None:
    contract = AcyclicModulesContract("no cycles", {}, {"containers": ["cyclepkg"]})
    check = contract.check(lazy_cycle, verbose=False)
    assert not check.kept
    [cycle] = check.metadata["cycles"]
    assert cycle["modules"] == ["cyclepkg", "cyclepkg.tracer"]
    assert sorted(cycle["imports"]) == [
        "cyclepkg -> cyclepkg.tracer (l.7)",
        "cyclepkg.tracer -> cyclepkg (l.1)",
    ]
