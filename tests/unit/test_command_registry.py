"""One way to add a command: every ``stepagent`` command, nested ones included, is registered by its group
module with its handler (``set_defaults(run=...)``), so ``cli.main`` runs ``args.run(args)`` and holds no
command of its own; the commands are listed in the order ``stepagent --help`` has always shown them."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from stepagent.cli import _parser


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of every command that runs (a parser without sub-commands of its own)."""
    nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not nested:
        yield path
    for action in nested:
        for name, sub in action.choices.items():
            yield from commands(sub, (*path, name))


def test_every_command_carries_its_handler() -> None:
    parser = _parser()
    found = list(commands(parser))
    assert [p[0] for p in found if len(p) == 1 or p[1] in ("create", "list")] == [
        "run",
        "api",
        "console",
        "send",
        "approve",
        "history",
        "chat",
        "tail",
        "infra",
        "dlq",
        "export",
        "import",
        "rewind",
        "usage",
        "configs",
    ]
    assert ("dlq", "redrive") in found and ("infra", "create") in found
    for path in found:
        handler = getattr(parser.parse_known_args([*path, *_required(path)])[0], "run", None)
        assert callable(handler), f"`stepagent {' '.join(path)}` has no handler"


def _required(path: tuple[str, ...]) -> list[str]:
    """Enough positional arguments and required options for ``path`` to parse."""
    return {
        ("send",): ["t", "hello"],
        ("approve",): ["t", "call"],
        ("history",): ["t"],
        ("chat",): ["t"],
        ("tail",): ["t"],
        ("infra", "create"): ["--endpoint-url", "http://localhost:4566"],
        ("dlq", "show"): ["m"],
        ("export",): ["t"],
        ("import",): ["f"],
        ("rewind",): ["t", "--to", "1"],
        ("usage",): ["t"],
    }.get(path, [])
