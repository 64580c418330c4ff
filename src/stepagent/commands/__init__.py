"""The ``stepagent`` commands, one module per group, each adding its own to the command line.

Every group module has ``register(subparsers)``: it adds its sub-commands to an ``argparse`` sub-parsers
object and attaches each one's handler with ``set_defaults(run=handler)``, a :data:`Handler` that takes
the parsed arguments and returns the coroutine that carries the command out (its exit status).
``stepagent.cli`` registers the groups in the order ``stepagent --help`` lists them, parses, runs
``args.run(args)`` and turns errors into text: a new command is a ``register`` in one of these modules,
nothing more.

Handlers import what they use when they run, so parsing a command line loads none of it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Coroutine
from typing import Any

#: A command's handler: the parsed arguments in, the coroutine that runs the command (its exit status) out.
Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]

__all__ = ["Handler"]
