"""``stepagent dlq list|show|redrive``: the dead-lettered messages of the input and tool queues, for people
(:mod:`stepagent.aws.dlq` finds the DLQs and moves the messages).

``list`` prints each message's queue, id, thread, receive count and reason (``--json``: one list), leaving it
in the DLQ; ``show`` prints one message whole, its body unwrapped from the queue claim check; ``redrive``
sends the named messages (or ``--all``) back to their source queue. A queue the settings do not name is
refused with the setting to give; an id no DLQ holds is reported and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the stubs are a development dependency: never imported at run time
    from types_aiobotocore_s3 import S3Client
    from types_aiobotocore_sqs import SQSClient

    from stepagent.aws.dlq import DeadLetter


def register(subparsers: Any) -> None:
    """Add ``dlq list``, ``dlq show`` and ``dlq redrive``."""
    dlq = subparsers.add_parser("dlq", help="dead-lettered messages: list, show, redrive")
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
        action.set_defaults(run=_dead_letters)


async def _dead_letters(args: argparse.Namespace) -> int:
    from stepagent.aws import dlq
    from stepagent.aws.clients import aws_session, client
    from stepagent.aws.stack_outputs import settings_for

    settings = await settings_for(args.stack)
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


async def _redrive(sqs: SQSClient, queues: dict[str, tuple[str, str]], ids: list[str]) -> int:
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
    found: Sequence[DeadLetter], message_id: str, wanted: list[str], s3: S3Client | None, bucket: str | None
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
