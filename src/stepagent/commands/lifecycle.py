"""The conversation lifecycle commands (``export``, ``import``, ``rewind``, ``usage``, ``configs``:
:mod:`stepagent.lifecycle.commands`), plus ``--state-dir DIR`` on each: the command then works on the local
state ``run --state-dir DIR`` keeps (``import`` and ``rewind`` save it back)."""

from __future__ import annotations

import argparse
from collections.abc import Coroutine
from typing import Any

from stepagent.commands import Handler
from stepagent.commands.local_state import add_state_dir, on_local_state

#: The lifecycle commands that change the local state, which is then saved back.
_SAVES = ("import", "rewind")


def register(subparsers: Any) -> None:
    """Add the lifecycle commands, each with ``--state-dir``."""
    from stepagent.lifecycle import commands as lifecycle

    lifecycle.register(subparsers)
    for name in lifecycle.COMMANDS:
        parser = subparsers.choices[name]
        add_state_dir(parser, "work on the local state kept by `run --state-dir DIR`")
        parser.set_defaults(run=_here_or_local(parser.get_default("run"), save=name in _SAVES))


def _here_or_local(run: Handler, *, save: bool) -> Handler:
    """``run`` on the deployment, or with ``--state-dir`` on the local state loaded from it."""

    def handler(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
        if args.state_dir:
            return on_local_state(args.state_dir, save, run(args))
        return run(args)

    return handler
