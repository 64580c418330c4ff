"""The ``stepagent`` command line: argument parsing and wiring, nothing else.

Commands: ``run`` (chat on the embedded local stack — the main job; ``--console`` opens the web console
instead, ``--api`` serves the HTTP API), ``api`` (the HTTP API, :mod:`stepagent.api`), ``console`` (the web
console, :mod:`stepagent.console`), ``send``, ``approve``, ``history``, ``chat`` and ``tail`` (a thread of any
deployment, through :mod:`stepagent.client`), ``infra create``, ``dlq``, and the conversation lifecycle:
``export``, ``import``, ``rewind``, ``usage``, ``configs``. Each group of commands is a module of
:mod:`stepagent.commands` that registers its own, with its handler; commands that touch the stores or
queues read the same settings as the handlers. Errors are printed for people (one line, what to do next)
with exit status 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from stepagent.commands import dlq, infra, lifecycle, local, servers, talk
from stepagent.errors import StepagentError
from stepagent.shutdown import exit_now, run_until_signalled

#: The command groups, in the order ``stepagent --help`` lists their commands.
GROUPS = (local, servers, talk, infra, dlq, lifecycle)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stepagent")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _Parser(argparse.ArgumentParser):
    """argparse, saying "did you mean ...?" for a mistyped command or choice (argparse's own
    ``suggest_on_error`` needs Python 3.14); mistyped options: :func:`_parse`."""

    def error(self, message: str) -> NoReturn:
        import difflib
        import re

        found = re.search(r"invalid choice: '?([^'\s]*)'? \(choose from (.*)\)", message)
        if found:
            choices = re.findall(r"'([^']*)'", found.group(2)) or [
                c.strip() for c in found.group(2).split(",")
            ]
            close = difflib.get_close_matches(found.group(1), choices, n=1, cutoff=0.5)
            if close:
                message += f"; did you mean {close[0]}?"
        super().error(message)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``; an unknown option is reported by the command it was given to (its usage, not the
    top level's), with the closest option that command has."""
    import difflib

    args, extras = parser.parse_known_args(argv)
    if not extras:
        return args
    command = parser
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        chosen = getattr(args, str(action.dest), None)
        if isinstance(action, argparse._SubParsersAction) and chosen in action.choices:
            command = action.choices[chosen]
            for sub in command._subparsers._group_actions if command._subparsers else ():
                inner = getattr(args, str(sub.dest), None)
                if isinstance(sub, argparse._SubParsersAction) and inner in sub.choices:
                    command = sub.choices[inner]
    options = sorted({o for a in [*command._actions, *parser._actions] for o in a.option_strings})
    parts = []
    for extra in extras:
        close = difflib.get_close_matches(extra.split("=", 1)[0], options, n=1, cutoff=0.6)
        parts.append(f"{extra} (did you mean {close[0]}?)" if extra.startswith("-") and close else extra)
    command.error(f"unrecognized arguments: {' '.join(parts)}")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="stepagent",
        description="Run AI agents as short steps driven by a queue.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and stepagent's debug logs")
    parser.add_argument(
        "--debug-sdk",
        action="store_true",
        help="with --debug, also the AWS SDK's, HTTP's and moto's debug logs",
    )
    parser.add_argument("--version", action="version", version=f"stepagent {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(commands)  # each command's handler: set_defaults(run=...)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``stepagent`` command: run ``argv`` (default: the process's arguments) and return the exit status.

    A :class:`~stepagent.errors.StepagentError` is printed as one line and exits 2 (raised with ``--debug``);
    Ctrl-C exits 130 and SIGTERM 143, within :data:`~stepagent.shutdown.SHUTDOWN_GRACE_SECONDS` whatever is
    still in flight (:mod:`stepagent.shutdown`)."""
    args = _parse(_parser(), argv)
    from stepagent.aws.settings import report_unknown_names

    # Before anything starts (and whatever the logging): a misspelt setting would otherwise be ignored.
    report_unknown_names(os.environ, lambda text: print(f"stepagent: warning: {text}", file=sys.stderr))
    # "Run from your project directory": STEPAGENT_TOOLS=myapp.tools:toolset imports from the current
    # directory, as `python -m` would (the console script's sys.path does not include it).
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return run_until_signalled(args.run(args))
    except StepagentError as error:
        if args.debug:
            raise
        print(f"stepagent: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`stepagent history T | head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def entry_point() -> NoReturn:
    """The ``stepagent`` program: :func:`main`, then the process ends at once, without the interpreter's
    teardown (:func:`stepagent.shutdown.exit_now`). In-process callers use :func:`main`."""
    exit_now(main())


if __name__ == "__main__":
    entry_point()
