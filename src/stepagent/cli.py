"""The ``stepagent`` command line.

Commands: ``run`` (chat on the embedded local stack — the main job; ``--console`` opens the web console
instead, ``--api`` serves the HTTP API), ``api`` (the HTTP API, :mod:`stepagent.api`), ``chat`` and ``tail`` (a thread of any deployment, through :mod:`stepagent.client`), ``console``
(the web console, :mod:`stepagent.console`), ``send``, ``history``, ``infra create``, ``dlq``, and the
conversation lifecycle: ``export``, ``import``, ``rewind``. Commands that touch the stores or queues read the same settings as the handlers.
Errors are printed for people (one line, what to do next) with exit status 2; ``--debug`` shows the
traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from stepagent.errors import ConfigurationError, StepagentError
from stepagent.shutdown import exit_now, run_until_signalled

if TYPE_CHECKING:  # the transcript module is imported by the commands that use it, not at startup
    from stepagent.transcript import Item


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

    run = commands.add_parser(
        "run",
        help="chat with an agent on the embedded local stack (moto, or AWS_ENDPOINT_URL)",
        description=(
            "Start a local stack (moto server on loopback unless AWS_ENDPOINT_URL points at one, e.g. "
            "LocalStack), create the tables and queues, run the worker, tool runner and timer relay, and chat. "
            "Without a model configured it runs the bundled offline demo."
        ),
    )
    run_say_help = "send TEXT, print the replies until the agent is idle (repeatable), then exit"
    run.add_argument("--say", action="append", default=[], metavar="TEXT", help=run_say_help)
    run.add_argument("--thread", default=None, help="the conversation (root thread) id; default: a new one")
    run.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the agent to go idle after each message",
    )

    state_help = (
        "keep the embedded stack's state in DIR across runs (default: $STEPAGENT_STATE_DIR; "
        "without it the local state is gone at exit)"
    )
    run.add_argument(
        "--state-dir", default=os.environ.get("STEPAGENT_STATE_DIR"), metavar="DIR", help=state_help
    )

    run.add_argument(
        "--trace",
        action="store_true",
        help="print each turn's span tree (OpenTelemetry: steps, model calls, tool runs) at the end",
    )
    run.add_argument(
        "--console",
        action="store_true",
        help="open the web console on the local stack instead of the terminal chat (Ctrl-C to stop)",
    )
    _console_options(run)
    run.add_argument(
        "--api",
        action="store_true",
        help="serve the HTTP API and its chat page on the local stack instead of the terminal chat "
        "(port --api-port; prints a dev token)",
    )
    run.add_argument("--api-port", type=int, default=None, help="the HTTP API's port (default 8788)")

    api = commands.add_parser(
        "api",
        help="serve the HTTP API for applications (and a chat page at /) over a deployment",
        description=(
            "Serve the HTTP API (send, approvals, history, a resumable event stream) over the deployment the "
            "settings (or --stack) name. Auth: STEPAGENT_API_AUTH=jwt with the STEPAGENT_JWT_* settings, or "
            "none (loopback only); --dev-token makes a signing key for this process and prints a token."
        ),
    )
    api.add_argument("--stack", default=None, help="a deployed stack's name (reads its outputs)")
    api.add_argument("--host", default="127.0.0.1", help="the address (default 127.0.0.1: this machine only)")
    api.add_argument("--port", type=int, default=None, help="the port (default 8788; 0: any free)")
    api.add_argument(
        "--dev-token",
        action="store_true",
        help="accept only tokens signed by a key made for this process, and print one (local development)",
    )

    console = commands.add_parser(
        "console",
        help="the web console: conversations, thread trees, live text, actions, DLQs (local-only web app)",
        description=(
            "Serve a local web application on the client (--stack NAME, or the STEPAGENT_* settings and "
            "AWS_ENDPOINT_URL): the conversations with their status and usage, each thread tree live, "
            "sending, answering choices, rewinding, exporting, and the dead-letter queues with redrive. "
            "It binds 127.0.0.1 unless --host says otherwise."
        ),
    )
    console.add_argument("--stack", default=None, help="a deployed stack's name (reads its outputs)")
    console.add_argument("--thread", default=None, help="print the URL of this conversation's page")
    _console_options(console)

    send = commands.add_parser("send", help="put a user message on the input queue")
    send.add_argument("thread", help="the thread (message group) id")
    send.add_argument("text", help="the message")
    send.add_argument("--stack", default=None, help="a deployed stack's name (reads its outputs)")

    approve = commands.add_parser(
        "approve",
        help="decide a tool call that waits for a person's approval",
        description=(
            "Decide a tool call that waits for approval (STEPAGENT_APPROVAL, a profile's approval list, "
            "@tool(approval=True)). Without an option the call runs as the model made it. THREAD is the "
            "conversation (or the thread that made the call); the decision goes to the thread waiting on "
            "CALL_ID. It waits until the decision is accepted or refused: a refused decision (a call that "
            "is not waiting, edited arguments that do not fit the tool) is printed, changes nothing, and "
            "the exit status is 1."
        ),
    )
    approve.add_argument("thread", help="the conversation (root thread) id, or the thread that made the call")
    approve.add_argument("call_id", metavar="CALL_ID", help="the waiting tool call's id")
    verdict = approve.add_mutually_exclusive_group()
    verdict.add_argument(
        "--reject",
        nargs="?",
        const="",
        default=None,
        metavar="MSG",
        help="decline the call; the model is told a person declined it (and MSG)",
    )
    verdict.add_argument("--edit", metavar="JSON", help="run the call with these arguments instead")
    verdict.add_argument(
        "--respond", metavar="TEXT", help="do not run the tool; the model gets TEXT as the call's result"
    )
    approve.add_argument("--stack", default=None, help="a deployed stack's name (reads its outputs)")
    approve.add_argument(
        "--state-dir",
        default=os.environ.get("STEPAGENT_STATE_DIR"),
        metavar="DIR",
        help="decide a call of the local state kept by `run --state-dir DIR` (its worker runs until the "
        "conversation is idle again, and what the agent does is printed)",
    )
    approve.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the decision to be accepted or refused (default 120)",
    )

    history = commands.add_parser(
        "history", help="print the stored transcript of a thread and its descendants"
    )
    history.add_argument("thread", help="the thread id")
    history.add_argument("--json", action="store_true", help="print one JSON list instead of text")
    history.add_argument("--stack", default=None, help="a deployed stack's name (reads its outputs)")
    history.add_argument(
        "--state-dir",
        default=os.environ.get("STEPAGENT_STATE_DIR"),
        metavar="DIR",
        help="read the local state kept by `run --state-dir DIR`",
    )

    chat = commands.add_parser(
        "chat",
        help="talk to a thread of a deployment (like run, against --stack NAME or the STEPAGENT_* settings)",
        description=(
            "Chat with the agent of a deployed stack (--stack NAME reads its outputs) or of the stack the "
            "STEPAGENT_* settings and AWS_ENDPOINT_URL name. The conversation is read from the stores, not "
            "from the output queue; answers to a tool's question are typed here."
        ),
    )
    chat.add_argument("thread", help="the conversation (root thread) id")
    chat.add_argument("--stack", default=None, help="a deployed stack's name (reads its outputs)")
    chat.add_argument("--say", action="append", default=[], metavar="TEXT", help=run_say_help)
    chat.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for each reply with --say"
    )

    tail = commands.add_parser("tail", help="follow a thread tree of a deployment as it is committed")
    tail.add_argument("thread", help="the thread id")
    tail.add_argument("--stack", default=None, help="a deployed stack's name (reads its outputs)")
    tail.add_argument("--history", action="store_true", help="print the stored transcript first")
    tail.add_argument(
        "--until-idle", action="store_true", help="exit once the thread tree is idle instead of following"
    )
    tail.add_argument("--timeout", type=float, default=None, help="with --until-idle: give up after SECONDS")

    infra = commands.add_parser("infra", help="manage the AWS resources")
    infra_commands = infra.add_subparsers(dest="infra_command", required=True, metavar="ACTION")
    create = infra_commands.add_parser(
        "create", help="create the tables, queues and bucket on moto or LocalStack and print the settings"
    )
    create.add_argument("--endpoint-url", required=True, help="e.g. http://localhost:4566 (LocalStack)")
    create.add_argument("--prefix", default="stepagent", help="name prefix for the resources")

    dlq = commands.add_parser("dlq", help="dead-lettered messages: list, show, redrive")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    for name, text in (
        ("list", "list dead-lettered messages with their thread and reason (left in the DLQ)"),
        ("show", "print one dead-lettered message whole"),
        ("redrive", "send dead-lettered messages back to their queue (after a fix)"),
    ):
        action = dlq_commands.add_parser(name, help=text, description=text)
        action.add_argument(
            "--queue", choices=["input", "tool", "all"], default="all", help="which DLQ (default: both)"
        )
        action.add_argument("--stack", default=None, help="a deployed stack's name (reads its outputs)")
        if name == "list":
            action.add_argument("--json", action="store_true", help="print one JSON list")
            action.add_argument("--limit", type=int, default=100, help="at most this many per DLQ")
        elif name == "show":
            action.add_argument("message_id", help="the SQS message id (from dlq list)")
        else:
            action.add_argument(
                "message_ids", nargs="*", metavar="MESSAGE_ID", help="the messages to redrive"
            )
            action.add_argument("--all", action="store_true", help="redrive every message of the DLQ(s)")

    from stepagent.lifecycle.commands import add_lifecycle_commands

    add_lifecycle_commands(commands)
    from stepagent.lifecycle.commands import COMMANDS

    for name in COMMANDS:
        commands.choices[name].add_argument(
            "--state-dir",
            default=os.environ.get("STEPAGENT_STATE_DIR"),
            metavar="DIR",
            help="work on the local state kept by `run --state-dir DIR`",
        )
    return parser


def _console_options(parser: argparse.ArgumentParser) -> None:
    from stepagent.console import DEFAULT_PORT

    parser.add_argument(
        "--host", default="127.0.0.1", help="the console's address (default 127.0.0.1: this machine only)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"the console's port (default {DEFAULT_PORT}; 0: any free)",
    )


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
        return run_until_signalled(_command(args))
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


def _command(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
    """The coroutine that carries out the parsed command (``main`` runs it and turns errors into text)."""
    if args.command == "run":
        from stepagent.devstack.chat import run_chat

        if args.api and args.api_port != 0:
            # MCP sign-ins ("auth": "oauth") return to this API's callback unless told otherwise.
            from stepagent.api import DEFAULT_PORT

            port = DEFAULT_PORT if args.api_port is None else args.api_port
            host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
            os.environ.setdefault("STEPAGENT_API_URL", f"http://{host}:{port}")

        return run_chat(
            say=args.say,
            thread_id=args.thread,
            idle_timeout=args.timeout,
            debug=args.debug,
            debug_sdk=args.debug_sdk,
            state_dir=args.state_dir,
            session=_local_api(args) if args.api else _local_console(args) if args.console else None,
            trace=args.trace,
        )
    if args.command == "console":
        return _console(args)
    if args.command == "api":
        return _api(args)
    if args.command in ("chat", "tail"):
        return _chat_or_tail(args)
    if args.command == "send":
        return _send(args.thread, args.text, args.stack)
    if args.command == "approve":
        return _approve_local(args) if args.state_dir else _approve(args)
    if args.command == "history":
        if args.state_dir:
            return _on_local_state(args.state_dir, False, _history(args.thread, as_json=args.json))
        return _history(args.thread, as_json=args.json, stack=args.stack)
    if args.command == "dlq":
        return _dlq(args)
    if args.command == "infra":
        from stepagent.devstack.stack import infra_create

        return infra_create(args.endpoint_url, args.prefix)
    from stepagent.lifecycle.commands import run_lifecycle_command

    # Every other command is a lifecycle command (the parser admits no others).
    if getattr(args, "state_dir", None):
        saves = args.command in ("import", "rewind")
        return _on_local_state(args.state_dir, saves, run_lifecycle_command(args))
    return run_lifecycle_command(args)


async def _on_local_state(state_dir: str, save: bool, command: Coroutine[Any, Any, int]) -> int:
    """Run ``command`` on the embedded stack loaded from ``state_dir`` (saved back when ``save``)."""
    from stepagent.devstack.chat import LOCAL_PREFIX
    from stepagent.devstack.snapshot import has_snapshot, local_state

    if not has_snapshot(Path(state_dir)):
        command.close()
        raise ConfigurationError(
            f"{state_dir} holds no local state (`stepagent run --state-dir {state_dir}` keeps it)"
        )
    async with local_state(state_dir, save=save, prefix=LOCAL_PREFIX):
        return await command


async def _settings(stack: str | None) -> Any:
    """The settings from the environment, or from a deployed stack's outputs (``--stack``)."""
    from stepagent.aws.stack_outputs import settings_for

    return await settings_for(stack)


async def _chat_or_tail(args: argparse.Namespace) -> int:
    from stepagent.client import Client
    from stepagent.client.terminal import approve_command, chat, tail

    async with Client(stack=args.stack) as client:
        if args.command == "chat":
            print(
                f"conversation {args.thread} — "
                + ("type a message (Ctrl-D to quit)" if not args.say else "sending"),
                file=sys.stderr,
            )
            stack = f" --stack {args.stack}" if args.stack else ""
            return await chat(
                client,
                args.thread,
                say=args.say,
                timeout=args.timeout,
                decide_later=lambda waiting: approve_command(waiting, stack),
            )
        return await tail(
            client, args.thread, history=args.history, until_idle=args.until_idle, timeout=args.timeout
        )


async def _console(args: argparse.Namespace) -> int:
    from stepagent.client import Client
    from stepagent.console.server import serve_console

    async with Client(stack=args.stack) as client:
        return await serve_console(
            client, host=args.host, port=args.port, stack=args.stack, thread=args.thread
        )


def _local_console(args: argparse.Namespace) -> Any:
    """``run --console``: what runs on the local stack once its services are up, instead of the chat."""

    async def session(settings: Any, thread_id: str, say: list[str]) -> int:
        from stepagent.client import Client
        from stepagent.console.server import serve_console

        async with Client(settings) as client:
            for text in say:
                await client.send(thread_id, text)
            return await serve_console(client, host=args.host, port=args.port, thread=thread_id)

    return session


async def _api(args: argparse.Namespace) -> int:
    from stepagent.api import DEFAULT_PORT
    from stepagent.api.server import serve_api
    from stepagent.client import Client

    async with Client(stack=args.stack) as client:
        port = DEFAULT_PORT if args.port is None else args.port
        return await serve_api(client, host=args.host, port=port, dev_token=args.dev_token)


def _local_api(args: argparse.Namespace) -> Any:
    """``run --api``: the HTTP API on the local stack, with a dev token, instead of the chat."""

    async def session(settings: Any, thread_id: str, say: list[str]) -> int:
        from stepagent.api import DEFAULT_PORT
        from stepagent.api.server import serve_api
        from stepagent.client import Client

        async with Client(settings) as client:
            port = DEFAULT_PORT if args.api_port is None else args.api_port
            return await serve_api(client, host=args.host, port=port, dev_token=True)

    return session


async def _send(thread_id: str, text: str, stack: str | None = None) -> int:
    from stepagent.client import Client

    settings = await _settings(stack)
    async with Client(settings, require=("STEPAGENT_INPUT_QUEUE_URL",)) as client:
        message_id = await client.send(thread_id, text)
    print(f"sent to thread {thread_id} (message {message_id})")
    return 0


def _decision(args: argparse.Namespace) -> tuple[str, dict[str, Any] | None, str | None]:
    """``(decision, arguments, message)`` from ``approve``'s options."""
    if args.reject is not None:
        return "reject", None, args.reject or None
    if args.edit is not None:
        try:
            arguments = json.loads(args.edit)
        except json.JSONDecodeError as error:
            raise ConfigurationError(
                f"--edit: not JSON ({error}); give the new arguments as an object"
            ) from None
        if not isinstance(arguments, dict):
            raise ConfigurationError('--edit: give the new arguments as a JSON object, e.g. {"to": "x"}')
        return "edit", arguments, None
    if args.respond is not None:
        return "respond", None, args.respond
    return "approve", None, None


async def _approve(args: argparse.Namespace) -> int:
    from stepagent.client import Client

    decision = _decision(args)
    async with Client(stack=args.stack) as client:
        return await _decide(client, args, decision, follow=False)


async def _approve_local(args: argparse.Namespace) -> int:
    """``approve --state-dir DIR``: the embedded stack of ``run --state-dir DIR``, with its worker running
    so that the decision is processed (and the call it lets run, and the model's next steps)."""
    from stepagent.devstack.chat import run_chat
    from stepagent.devstack.snapshot import has_snapshot

    decision = _decision(args)
    if not has_snapshot(Path(args.state_dir)):
        raise ConfigurationError(
            f"{args.state_dir} holds no local state (`stepagent run --state-dir {args.state_dir}` keeps it)"
        )

    async def session(settings: Any, thread_id: str, say: list[str]) -> int:
        from stepagent.client import Client

        async with Client(settings) as client:
            return await _decide(client, args, decision, follow=True)

    return await run_chat(
        say=[],
        thread_id=args.thread,
        idle_timeout=args.timeout,
        debug=args.debug,
        debug_sdk=args.debug_sdk,
        state_dir=args.state_dir,
        session=session,
    )


async def _decide(
    client: Any,
    args: argparse.Namespace,
    decision: tuple[str, dict[str, Any] | None, str | None],
    *,
    follow: bool,
) -> int:
    """Send the decision and wait for its outcome (:func:`stepagent.client.decisions.decision_outcome`):
    0 when accepted, 1 when refused or not processed in time. ``follow``: print the tree's lines until it
    is idle again (the local stack, whose worker runs only while this command does)."""
    from stepagent.client.decisions import decision_outcome
    from stepagent.transcript import item_line

    verdict, arguments, message = decision
    waiting = {item["tool_call_id"]: item for item in await client.pending_approvals(args.thread)}
    message_id = await client.approve(args.thread, args.call_id, verdict, arguments, message)
    call = waiting.get(args.call_id)
    if call is None:
        print(
            f"stepagent: no call {args.call_id} is waiting for approval in {args.thread} now; sent anyway "
            f"(message {message_id}) to see what the thread says",
            file=sys.stderr,
        )
    else:
        print(
            f"sent {verdict} for {call['name']} ({args.call_id}) to thread {call['thread_id']} "
            f"(message {message_id})",
            flush=True,
        )
    accepted = False
    try:
        async with contextlib.aclosing(client.replies(args.thread, timeout=args.timeout)) as items:
            async for item in items:
                if follow and (line := item_line(item, args.thread)) is not None:
                    print(line, flush=True)
                outcome = decision_outcome(item, args.call_id, message_id)
                if outcome == "refused":
                    print(f"stepagent: the decision was refused: {item.get('text', '')}", file=sys.stderr)
                    return 1
                if outcome == "accepted":
                    accepted = True
                    if not follow:
                        break
    except TimeoutError:
        if accepted:
            print(f"stepagent: the agent was still working after {args.timeout:.0f} s", file=sys.stderr)
            return 0
        print(
            f"stepagent: no outcome after {args.timeout:.0f} s: the decision (message {message_id}) is queued; "
            f"see `stepagent history {args.thread}`",
            file=sys.stderr,
        )
        return 1
    if not accepted:
        print(
            f"stepagent: the decision was not applied: {args.thread} processed it, and nothing decided "
            f"call {args.call_id}",
            file=sys.stderr,
        )
        return 1
    return 0


async def _history(thread_id: str, *, as_json: bool, stack: str | None = None) -> int:
    from stepagent.client import Client

    settings = await _settings(stack)
    tables = ("STEPAGENT_CONVERSATION_TABLE", "STEPAGENT_STATE_TABLE")
    async with Client(settings, require=tables) as client:
        conversation, _ = client.stores
        if await conversation.get_thread(thread_id) is None:
            print(f"stepagent: no thread {thread_id!r} in {settings.conversation_table}", file=sys.stderr)
            return 1
        items = await client.history(thread_id)
        closed = set()
        for child in dict.fromkeys(i["thread_id"] for i in items):
            info = await conversation.get_thread(child)
            if info is not None and info.closed:
                closed.add(child)
    if as_json:
        print(json.dumps(items, ensure_ascii=False, indent=2))
    else:
        for line in format_transcript(items, root_id=thread_id, closed=closed):
            print(line)
    return 0


async def _dlq(args: argparse.Namespace) -> int:
    from stepagent.aws import dlq
    from stepagent.aws.clients import aws_session, client

    settings = await _settings(args.stack)
    sources = {"input": settings.input_queue_url, "tool": settings.tool_queue_url}
    if args.queue != "all":
        settings.require(f"STEPAGENT_{args.queue.upper()}_QUEUE_URL")
    wanted = [q for q in (dlq.QUEUES if args.queue == "all" else [args.queue]) if sources[q]]
    if not wanted:
        settings.require("STEPAGENT_INPUT_QUEUE_URL", "STEPAGENT_TOOL_QUEUE_URL")
    if args.dlq_command == "redrive" and not args.message_ids and not args.all:
        print(
            "stepagent: name the MESSAGE_IDs to redrive (see `stepagent dlq list`), or pass --all",
            file=sys.stderr,
        )
        return 2
    session = aws_session(settings)
    async with client(session, "sqs", settings) as sqs, client(session, "s3", settings) as s3:
        queues = {q: (str(sources[q]), await dlq.dead_letter_queue(sqs, str(sources[q]))) for q in wanted}
        if args.dlq_command == "redrive":
            return await _redrive(sqs, queues, list(args.message_ids))
        limit = getattr(args, "limit", 1000)
        found = [
            letter
            for q, (_, url) in queues.items()
            for letter in await dlq.list_dead_letters(sqs, url, q, limit)
        ]
        if args.dlq_command == "show":
            return await _show_letter(found, args.message_id, wanted, s3, settings.blob_bucket)
    if args.json:
        print(json.dumps([f.summary() for f in found], ensure_ascii=False, indent=2))
    elif not found:
        print(f"the {' and '.join(wanted)} DLQ{'s are' if len(wanted) > 1 else ' is'} empty")
    else:
        for letter in found:
            reason = letter.reason or "failed its last allowed attempt"
            print(
                f"{letter.queue:5} {letter.message_id}  thread {letter.thread_id}  x{letter.receive_count}  {reason}"
            )
    return 0


async def _redrive(sqs: Any, queues: dict[str, tuple[str, str]], ids: list[str]) -> int:
    """Redrive ``ids`` from whichever DLQ holds each, or everything when ``ids`` is empty."""
    from stepagent.aws import dlq

    left = list(ids)
    for queue, (source, dlq_url) in queues.items():
        if ids:
            present = {f.message_id for f in await dlq.list_dead_letters(sqs, dlq_url, queue, 1000)}
            mine = [i for i in left if i in present]
            if not mine:
                continue
            left = [i for i in left if i not in mine]
            moved = await dlq.redrive(sqs, dlq_url, source, queue, message_ids=mine)
        else:
            moved = await dlq.redrive(sqs, dlq_url, source, queue)
        print(f"{queue}: redrove {len(moved)} message(s) to {source}")
    if left:
        print(f"stepagent: not in the DLQ: {', '.join(left)}", file=sys.stderr)
        return 1
    return 0


async def _show_letter(
    found: Sequence[Any], message_id: str, wanted: list[str], s3: Any, bucket: str | None
) -> int:
    from stepagent.blobs import ContentBlobs
    from stepagent.senders.claim_check import unwrap_body

    letter = next((f for f in found if f.message_id == message_id), None)
    if letter is None:
        print(f"stepagent: no message {message_id!r} in the {' or '.join(wanted)} DLQ", file=sys.stderr)
        return 1
    print(f"queue:    {letter.queue}\nmessage:  {letter.message_id}\nthread:   {letter.thread_id}")
    print(f"reason:   {letter.reason or '(none recorded: it failed its last allowed attempt)'}")
    print(f"receives: {letter.receive_count}\nbody:")
    print(await unwrap_body(letter.body, ContentBlobs(s3, bucket) if s3 is not None and bucket else None))
    return 0


#: How ``history`` marks a call that waited for a person (the chat's marks for the decision).
APPROVAL_MARKS = {
    "pending": "⏸ waiting for a decision",
    "approved": "✔ approved",
    "edited": "✎ edited (the arguments shown are the person's)",
    "rejected": "✗ rejected",
    "responded": "↩ responded",
}


def format_transcript(
    items: Sequence[Item], *, root_id: str, closed: frozenset[str] | set[str] = frozenset()
) -> list[str]:
    """Human-readable transcript lines under one header per thread (marked root and/or closed): each item
    by its order, with the glyphs the chat shows (:func:`stepagent.transcript.item_glyph_text`), whole."""
    from stepagent.transcript import item_glyph_text

    lines: list[str] = []
    current: str | None = None
    for item in items:
        thread = item["thread_id"]
        if thread != current:
            current = thread
            marks = [m for m, on in (("root", thread == root_id), ("closed", thread in closed)) if on]
            lines.append(f"── thread {thread}" + (f" ({', '.join(marks)})" if marks else ""))
        body = item_glyph_text(item, limit=None) or f"{item['kind']}: {item.get('text', '')}"
        if "approval" in item:
            body += f"  {APPROVAL_MARKS.get(str(item['approval']), item['approval'])}"
        lines.append(f"{item['order']:>4} {body}")
    return lines


def entry_point() -> NoReturn:
    """The ``stepagent`` program: :func:`main`, then the process ends at once, without the interpreter's
    teardown (:func:`stepagent.shutdown.exit_now`). In-process callers use :func:`main`."""
    exit_now(main())


if __name__ == "__main__":
    entry_point()
