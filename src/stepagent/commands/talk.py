"""Talking to a deployment's threads from the command line, through :mod:`stepagent.client`: ``send`` a
message, ``approve`` (decide) a call waiting for a person, print the ``history``, ``chat`` with a thread and
``tail`` one. ``approve`` and ``history`` also work on the local state of ``run --state-dir DIR``."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from stepagent.commands.local import SAY_HELP
from stepagent.commands.local_state import add_state_dir, on_local_state
from stepagent.errors import ConfigurationError


def register(subparsers: Any) -> None:
    """Add ``send``, ``approve``, ``history``, ``chat`` and ``tail``."""
    send = subparsers.add_parser("send", help="put a user message on the input queue")
    send.add_argument("thread", help="the thread (message group) id")
    send.add_argument("text", help="the message")
    send.add_argument("--stack", default=None, help="a deployed stack's name (reads its outputs)")
    send.set_defaults(run=lambda args: _send(args.thread, args.text, args.stack))

    approve = subparsers.add_parser(
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
    add_state_dir(
        approve,
        "decide a call of the local state kept by `run --state-dir DIR` (its worker runs until the "
        "conversation is idle again, and what the agent does is printed)",
    )
    approve.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the decision to be accepted or refused (default 120)",
    )
    approve.set_defaults(run=_approve_here_or_local)

    history = subparsers.add_parser(
        "history", help="print the stored transcript of a thread and its descendants"
    )
    history.add_argument("thread", help="the thread id")
    history.add_argument("--json", action="store_true", help="print one JSON list instead of text")
    history.add_argument("--stack", default=None, help="a deployed stack's name (reads its outputs)")
    add_state_dir(history, "read the local state kept by `run --state-dir DIR`")
    history.set_defaults(run=_history_here_or_local)

    chat = subparsers.add_parser(
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
    chat.add_argument("--say", action="append", default=[], metavar="TEXT", help=SAY_HELP)
    chat.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for each reply with --say"
    )
    chat.set_defaults(run=_chat)

    tail = subparsers.add_parser("tail", help="follow a thread tree of a deployment as it is committed")
    tail.add_argument("thread", help="the thread id")
    tail.add_argument("--stack", default=None, help="a deployed stack's name (reads its outputs)")
    tail.add_argument("--history", action="store_true", help="print the stored transcript first")
    tail.add_argument(
        "--until-idle", action="store_true", help="exit once the thread tree is idle instead of following"
    )
    tail.add_argument("--timeout", type=float, default=None, help="with --until-idle: give up after SECONDS")
    tail.set_defaults(run=_tail)


def _approve_here_or_local(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
    return _approve_local(args) if args.state_dir else _approve(args)


def _history_here_or_local(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
    if args.state_dir:
        return on_local_state(args.state_dir, False, _history(args.thread, as_json=args.json))
    return _history(args.thread, as_json=args.json, stack=args.stack)


async def _chat(args: argparse.Namespace) -> int:
    from stepagent.client import Client
    from stepagent.client.terminal import approve_command, chat

    async with Client(stack=args.stack) as client:
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


async def _tail(args: argparse.Namespace) -> int:
    from stepagent.client import Client
    from stepagent.client.terminal import tail

    async with Client(stack=args.stack) as client:
        return await tail(
            client, args.thread, history=args.history, until_idle=args.until_idle, timeout=args.timeout
        )


async def _send(thread_id: str, text: str, stack: str | None = None) -> int:
    from stepagent.aws.stack_outputs import settings_for
    from stepagent.client import Client

    settings = await settings_for(stack)
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
    from stepagent.aws.stack_outputs import settings_for
    from stepagent.client import Client

    settings = await settings_for(stack)
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
        from stepagent.transcript import format_transcript

        for line in format_transcript(items, root_id=thread_id, closed=closed):
            print(line)
    return 0
