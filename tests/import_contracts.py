"""An import-linter contract for ``make lint``: no import cycle between any two files of a package.

The built-in ``acyclic_siblings`` contract compares siblings, so a package's ``__init__`` and one of its own
modules importing each other is no cycle to it. This one treats every module as a file — a package's
``__init__`` is a module like any other — and counts every import grimp finds: at the top, inside functions
and under ``TYPE_CHECKING``. An import inside a function still runs, and two files that import each other
can only be read, changed and loaded together.

Registered in ``pyproject.toml`` (``contract_types``) as ``acyclic_modules``; ``lint-imports`` runs from the
repository root, which it puts on ``sys.path``, so this module imports as ``tests.import_contracts``.
:func:`module_cycles` is the check itself, also used by ``tests/unit/test_import_cycles.py``.
"""

from __future__ import annotations

from collections.abc import Iterable

import grimp
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def module_cycles(graph: grimp.ImportGraph, container: str) -> list[list[str]]:
    """Each group of modules of ``container`` that import each other in a circle (a strongly connected
    component of more than one module), sorted; empty when the package's file graph has no cycle."""
    modules = {container} | graph.find_descendants(container)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & modules) for m in sorted(modules)}
    return sorted(sorted(group) for group in _strongly_connected(edges) if len(group) > 1)


def _strongly_connected(edges: dict[str, list[str]]) -> Iterable[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit to meet on a deep import chain)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for root in edges:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, position = work.pop()
            if position == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            for i in range(position, len(edges[node])):
                target = edges[node][i]
                if target not in index:
                    work.append((node, i + 1))
                    work.append((target, 0))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    yield group
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])


class AcyclicModulesContract(Contract):
    """``containers``: the packages whose modules (files) must not import each other in a circle."""

    type_name = "acyclic_modules"

    containers = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        found = []
        for container in self.containers:  # type: ignore[attr-defined]
            for group in module_cycles(graph, container):
                imports = [
                    f"{detail['importer']} -> {detail['imported']} (l.{detail['line_number']})"
                    for importer in group
                    for imported in group
                    for detail in graph.get_import_details(importer=importer, imported=imported)
                ]
                found.append({"modules": group, "imports": imports})
        return ContractCheck(kept=not found, metadata={"cycles": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for cycle in check.metadata["cycles"]:
            output.print_error(f"These modules import each other in a circle: {', '.join(cycle['modules'])}")
            for line in cycle["imports"]:
                output.indent_cursor()
                output.print_error(f"- {line}", bold=False)
            output.new_line()
        output.print_error(
            "Move what both need into a module of its own, or pass it in, so the imports run one way.",
            bold=False,
        )
