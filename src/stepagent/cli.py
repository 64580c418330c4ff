"""The ``stepagent`` command line.

Commands: ``run`` (chat on the embedded local stack — the main job), ``send``, ``history``,
``infra create``, and the conversation lifecycle: ``export``, ``import``, ``rewind``. Commands that touch the stores or queues read the same settings as the handlers.
Errors are printed for people (one line, what to do next) with exit status 2; ``--debug`` shows the
traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from stepagent.errors import StepagentError


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stepagent")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stepagent",
        description="Run AI agents as short steps driven by a queue.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
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
    run.add_argument(
        "--say",
        action="append",
        default=[],
        metavar="TEXT",
        help="send TEXT, wait until idle (repeatable), then exit",
    )
    run.add_argument("--thread", default=None, help="the conversation (root thread) id; default: a new one")
    run.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the agent to go idle after each message",
    )

    send = commands.add_parser("send", help="put a user message on the input queue")
    send.add_argument("thread", help="the thread (message group) id")
    send.add_argument("text", help="the message")
    send.add_argument("--stack", default=None, help="a deployed stack's name (reads its outputs)")

    history = commands.add_parser(
        "history", help="print the stored transcript of a thread and its descendants"
    )
    history.add_argument("thread", help="the thread id")
    history.add_argument("--json", action="store_true", help="print one JSON list instead of text")
    history.add_argument("--stack", default=None, help="a deployed stack's name (reads its outputs)")

    infra = commands.add_parser("infra", help="manage the AWS resources")
    infra_commands = infra.add_subparsers(dest="infra_command", required=True, metavar="ACTION")
    create = infra_commands.add_parser(
        "create", help="create the tables, queues and bucket on moto or LocalStack and print the settings"
    )
    create.add_argument("--endpoint-url", required=True, help="e.g. http://localhost:4566 (LocalStack)")
    create.add_argument("--prefix", default="stepagent", help="name prefix for the resources")

    from stepagent.lifecycle.commands import add_lifecycle_commands

    add_lifecycle_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # "Run from your project directory": STEPAGENT_TOOLS=myapp.tools:toolset imports from the current
    # directory, as `python -m` would (the console script's sys.path does not include it).
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from stepagent.aws.settings import unknown_setting_warnings

    for warning in unknown_setting_warnings():
        print(f"stepagent: warning: {warning}", file=sys.stderr)
    try:
        if args.command == "run":
            from stepagent.devstack.chat import run_chat

            return asyncio.run(
                run_chat(say=args.say, thread_id=args.thread, idle_timeout=args.timeout, debug=args.debug)
            )
        if args.command == "send":
            return asyncio.run(_send(args.thread, args.text, args.stack))
        if args.command == "history":
            return asyncio.run(_history(args.thread, as_json=args.json, stack=args.stack))
        if args.command == "infra":
            from stepagent.devstack.stack import infra_create

            return asyncio.run(infra_create(args.endpoint_url, args.prefix))
        from stepagent.lifecycle.commands import COMMANDS, run_lifecycle_command

        if args.command in COMMANDS:
            return asyncio.run(run_lifecycle_command(args))
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
    return 2


async def _settings(stack: str | None) -> Any:
    """The settings from the environment, or from a deployed stack's outputs (``--stack``)."""
    import os

    from stepagent.aws.settings import Settings

    if stack is None:
        return Settings.from_env()
    from stepagent.aws.stack_outputs import stack_environment

    return Settings.from_env({**os.environ, **await stack_environment(stack)})


async def _send(thread_id: str, text: str, stack: str | None = None) -> int:
    from stepagent.aws.clients import aws_session, client
    from stepagent.aws.settings import Settings
    from stepagent.messages import InputMessage
    from stepagent.senders.sqs import SqsSender

    settings: Settings = await _settings(stack)
    settings.require("STEPAGENT_INPUT_QUEUE_URL")
    assert settings.input_queue_url is not None
    async with (
        client(aws_session(settings), "sqs", settings) as sqs,
        client(aws_session(settings), "s3", settings) as s3,
    ):
        sender = SqsSender(sqs, settings.input_queue_url, s3_client=s3, bucket=settings.blob_bucket)
        message_id = str(uuid.uuid4())
        await sender.send(InputMessage.user_text(thread_id, text, id=message_id), message_id)
    print(f"sent to thread {thread_id} (message {message_id})")
    return 0


async def _history(thread_id: str, *, as_json: bool, stack: str | None = None) -> int:
    from stepagent.aws.clients import aws_session, client
    from stepagent.aws.settings import Settings
    from stepagent.stores.dynamodb import dynamo_stores
    from stepagent.transcript import tree_items

    settings: Settings = await _settings(stack)
    settings.require("STEPAGENT_CONVERSATION_TABLE", "STEPAGENT_STATE_TABLE")
    assert settings.conversation_table is not None and settings.state_table is not None
    session = aws_session(settings)
    async with client(session, "dynamodb", settings) as dynamodb, client(session, "s3", settings) as s3:
        conversation, _ = dynamo_stores(
            dynamodb,
            conversation_table=settings.conversation_table,
            state_table=settings.state_table,
            s3_client=s3,
            bucket=settings.blob_bucket,
        )
        if await conversation.get_thread(thread_id) is None:
            print(f"stepagent: no thread {thread_id!r} in {settings.conversation_table}", file=sys.stderr)
            return 1
        items = [item async for item in tree_items(conversation, thread_id)]
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


def format_transcript(
    items: Sequence[dict[str, Any]], *, root_id: str, closed: frozenset[str] | set[str] = frozenset()
) -> list[str]:
    """Human-readable transcript lines under one header per thread (marked root and/or closed)."""
    lines: list[str] = []
    current: str | None = None
    for item in items:
        thread = item["thread_id"]
        if thread != current:
            current = thread
            marks = [m for m, on in (("root", thread == root_id), ("closed", thread in closed)) if on]
            lines.append(f"── thread {thread}" + (f" ({', '.join(marks)})" if marks else ""))
        kind = item["kind"]
        prefix = f"{item['order']:>4} "
        if kind == "tool_call":
            lines.append(f"{prefix}→ {item['name']}({json.dumps(item['args'], ensure_ascii=False)})")
        elif kind in ("tool_result", "event"):
            lines.append(f"{prefix}← {item.get('text', '')}")
        else:
            lines.append(f"{prefix}{kind}: {item.get('text', '')}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
