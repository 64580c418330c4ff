"""The ``export``, ``import``, ``rewind``, ``usage`` and ``configs`` CLI commands (:func:`register` adds them,
each with its handler, to ``stepagent``'s command line).

``usage THREAD [--json] [--stack NAME]`` prints the token totals of a thread tree
(:func:`stepagent.usage.thread_usage`). They read the same settings as the handlers (``STEPAGENT_CONVERSATION_TABLE``, ``STEPAGENT_STATE_TABLE``,
``STEPAGENT_BLOB_BUCKET``, ``AWS_ENDPOINT_URL``). ``export`` writes the lines to a spool file, then to stdout (or
``--output``, replaced at once), so a failure never leaves a partial export; ``import`` reads a file twice (validate, then write), so standard input (``-``) is first spooled to
a temporary file. Failures a person can fix raise :class:`~stepagent.errors.StepagentError` subclasses with
a one-line message; ``cli.main`` prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import IO, Any

from stepagent.aws.transient import retry_transient
from stepagent.lifecycle.export import LifecycleError, export_lines
from stepagent.lifecycle.importer import ImportLimits, import_tree
from stepagent.lifecycle.rewind import rewind_thread
from stepagent.providers.prices import PRICES_SETTING, parse_prices
from stepagent.stores.base import ConversationStore, StateStore
from stepagent.usage import thread_usage, turn_usage

COMMANDS = ("export", "import", "rewind", "usage", "configs")


def register(subparsers: Any) -> None:
    """Add ``export``, ``import``, ``rewind``, ``usage`` and ``configs`` to an ``argparse`` sub-parsers object,
    each with its handler (``set_defaults(run=...)``: the parsed arguments in, the exit status out)."""
    export = subparsers.add_parser(
        "export", help="write a thread and its descendants as JSON lines (stdout by default)"
    )
    export.add_argument("thread", help="the thread id (usually a root)")
    export.add_argument(
        "--output", "-o", default=None, metavar="FILE", help="write to FILE instead of stdout"
    )
    export.set_defaults(run=_on_stores(_export))

    importer = subparsers.add_parser(
        "import",
        help="recreate a thread tree from an export file",
        description=(
            "Validate every line of FILE first (nothing is written if any line is bad), then write the tree. "
            "With --as the copy gets fresh ids (the root NEW_ROOT, children derived from it); thread ids "
            "inside texts and tool-call arguments are not rewritten."
        ),
    )
    importer.add_argument("file", help="an export file, or - for standard input")
    importer.add_argument(
        "--as", dest="new_root", default=None, metavar="NEW_ROOT", help="import a copy as NEW_ROOT"
    )
    importer.add_argument(
        "--replace", action="store_true", help="restore over existing threads with the same ids (in place)"
    )
    limits = ImportLimits()
    importer.add_argument(
        "--max-line-bytes",
        type=int,
        default=limits.max_line_bytes,
        metavar="N",
        help=f"refuse a file with a line longer than N bytes (default {limits.max_line_bytes:,})",
    )
    importer.add_argument(
        "--max-rows",
        type=int,
        default=limits.max_rows,
        metavar="N",
        help=f"refuse a file with more than N history rows (default {limits.max_rows:,})",
    )
    importer.add_argument(
        "--max-threads",
        type=int,
        default=limits.max_threads,
        metavar="N",
        help=f"refuse a file with more than N threads (default {limits.max_threads:,})",
    )
    importer.set_defaults(run=_on_stores(_import))

    rewind = subparsers.add_parser(
        "rewind",
        help="drop everything after a committed order (see `history --json` for orders)",
        description=(
            "Drop the thread's rows after ORDER. A cut inside a tool call/result pair moves to the pair's "
            "start; the order actually used is printed. Intents, subscriptions and children started after "
            "it are cleaned up; inputs whose turns are dropped stay processed."
        ),
    )
    rewind.add_argument("thread", help="the thread id")
    rewind.add_argument(
        "--to", dest="order", type=int, required=True, metavar="ORDER", help="last order to keep"
    )
    rewind.add_argument(
        "--expected-version",
        type=int,
        default=None,
        metavar="V",
        help="fail instead of retrying if the thread is no longer at head version V",
    )
    rewind.set_defaults(run=_on_stores(_rewind))

    usage = subparsers.add_parser(
        "usage",
        help="token totals of a thread and its descendants, per model and per thread",
        description=(
            "Sum the token usage every step of the thread tree committed: input (uncached), output and "
            "prompt-cache tokens, model calls, steps and dollars (for models with known prices; "
            "STEPAGENT_PRICES adds or overrides prices) — in total, per model and per thread."
        ),
    )
    usage.add_argument("thread", help="the thread id (usually a root)")
    usage.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    usage.add_argument(
        "--turns",
        action="store_true",
        help="one row per turn of the conversation (what each user message cost, its threads included)",
    )
    usage.add_argument("--stack", default=None, help="a deployed stack's name (reads its outputs)")
    usage.set_defaults(run=_on_stores(_usage))

    configs = subparsers.add_parser(
        "configs",
        help="which open threads last stepped under another agent configuration (after a deploy)",
        description=(
            "Read every thread's head (a Scan of the conversation table) and list the open threads whose "
            "last step ran another agent configuration than the current one (--current, else the one of "
            "the most recent commit), with the stepagent release of that step and the configuration the "
            "thread started with."
        ),
    )
    configs.add_argument("--current", default=None, metavar="FINGERPRINT", help="the current configuration")
    configs.add_argument("--all", action="store_true", help="list every open thread")
    configs.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    configs.add_argument("--stack", default=None, help="a deployed stack's name (reads its outputs)")
    configs.set_defaults(run=_on_stores(_configs))


async def run_lifecycle_command(args: argparse.Namespace) -> int:
    """Run the parsed ``export``/``import``/``rewind``/``usage``/``configs`` command (its handler, which
    :func:`register` attached); the exit status. ``export``, ``import`` and ``rewind`` run again, after a
    jittered wait, while they fail transiently (throttling, a 5xx, a transaction another writer's
    cancelled: :func:`~stepagent.aws.transient.retry_transient`); each is safe to run again."""
    run: Callable[[argparse.Namespace], Awaitable[int]] | None = getattr(args, "run", None)
    if run is None:
        raise LifecycleError(f"unknown lifecycle command {args.command!r}")
    return await run(args)


_Body = Callable[[ConversationStore, StateStore, argparse.Namespace], Awaitable[int]]


def _on_stores(body: _Body) -> Callable[[argparse.Namespace], Coroutine[Any, Any, int]]:
    """The handler that opens the deployment's stores (the settings, or ``--stack``) and runs ``body``."""

    async def run(args: argparse.Namespace) -> int:
        async with _stores(getattr(args, "stack", None)) as (conversation, state):
            return await body(conversation, state, args)

    return run


@asynccontextmanager
async def _stores(stack: str | None = None) -> AsyncIterator[tuple[ConversationStore, StateStore]]:
    from stepagent.aws.clients import aws_session, client
    from stepagent.aws.stack_outputs import settings_for
    from stepagent.stores.dynamodb import dynamo_stores

    settings = await settings_for(stack)
    settings.require("STEPAGENT_CONVERSATION_TABLE", "STEPAGENT_STATE_TABLE")
    assert settings.conversation_table is not None and settings.state_table is not None
    session = aws_session(settings)
    async with client(session, "dynamodb", settings) as dynamodb, client(session, "s3", settings) as s3:
        yield dynamo_stores(
            dynamodb,
            conversation_table=settings.conversation_table,
            state_table=settings.state_table,
            s3_client=s3,
            bucket=settings.blob_bucket,
        )


async def _export(conversation: ConversationStore, state: StateStore, args: argparse.Namespace) -> int:
    if await retry_transient(lambda: conversation.get_thread(args.thread)) is None:
        print(f"stepagent: no thread {args.thread!r}", file=sys.stderr)
        return 1
    # The lines go to a spool first, so a pass that fails half-way (and is run again) never leaves a
    # partial export behind: stdout gets the whole file or nothing, and --output is replaced at once.
    with _spool(args.output) as spool:

        async def write_all() -> None:
            spool.seek(0)
            spool.truncate()
            async for line in export_lines(conversation, state, args.thread):
                spool.write(line)
                spool.write("\n")

        await retry_transient(write_all)
        _deliver(spool, args.output)
    return 0


@contextmanager
def _spool(output: str | None) -> Iterator[IO[str]]:
    """A temporary file beside ``output`` (so it can be renamed over it) or in the temporary directory."""
    folder = Path(tempfile.gettempdir()) if output is None else Path(output).resolve().parent
    try:
        spool = tempfile.NamedTemporaryFile(  # noqa: SIM115 -- closed below, kept for the rename
            "w+", encoding="utf-8", dir=folder, prefix=".stepagent-export-", delete=False
        )
    except OSError as exc:
        raise LifecycleError(f"cannot write {output or folder}: {exc.strerror or exc}") from None
    try:
        with spool:
            yield spool
    finally:
        Path(spool.name).unlink(missing_ok=True)


def _deliver(spool: IO[str], output: str | None) -> None:
    spool.flush()
    if output is None:
        spool.seek(0)
        shutil.copyfileobj(spool, sys.stdout)
        sys.stdout.flush()
        return
    try:
        os.replace(spool.name, output)
    except OSError as exc:
        raise LifecycleError(f"cannot write {output}: {exc.strerror or exc}") from None


async def _usage(conversation: ConversationStore, state: StateStore, args: argparse.Namespace) -> int:
    # Steps stored their cost when they ran; older records are priced now (catalog + STEPAGENT_PRICES).
    report = await thread_usage(conversation, args.thread, parse_prices(os.environ.get(PRICES_SETTING)))
    if report is None:
        print(f"stepagent: no thread {args.thread!r}", file=sys.stderr)
        return 1
    turns = None
    if args.turns:
        turns = await turn_usage(conversation, args.thread, parse_prices(os.environ.get(PRICES_SETTING)))
    if args.json:
        data = report.as_dict()
        if turns is not None:
            data["turns"] = [turn.as_dict() for turn in turns]
        print(json.dumps(data, indent=2))
    else:
        for line in report.lines():
            print(line)
        if turns is not None:
            print("  by turn:")
            for turn in turns:
                print(f"    {turn.line()}")
    return 0


async def _configs(conversation: ConversationStore, state: StateStore, args: argparse.Namespace) -> int:
    from stepagent.lifecycle.configs import as_json, configs_report, report_lines, scan_configs
    from stepagent.stores.dynamodb import DynamoConversationStore

    if not isinstance(conversation, DynamoConversationStore):
        raise LifecycleError("configs reads a deployment's DynamoDB table")
    threads = await retry_transient(lambda: scan_configs(conversation))
    report = configs_report(threads, args.current, show_all=args.all)
    print(as_json(report) if args.json else "\n".join(report_lines(report)))
    return 0


async def _import(conversation: ConversationStore, state: StateStore, args: argparse.Namespace) -> int:
    limits = ImportLimits(args.max_line_bytes, args.max_rows, args.max_threads)
    with tempfile.TemporaryDirectory() as spool_dir:
        path = args.file
        if path == "-":  # two passes need a file that can be read twice
            path = str(Path(spool_dir) / "import.jsonl")
            _spool_stdin(path)
        result = await retry_transient(
            lambda: import_tree(
                conversation,
                state,
                path,
                new_root=args.new_root,
                replace_existing=args.replace,
                limits=limits,
            )
        )
    print(
        f"imported {result.threads} thread(s), {result.rows} row(s) as {result.root_thread_id}"
        + (f"; replaced {result.replaced} existing thread(s)" if result.replaced else "")
        + (f"; closed {len(result.closed)} thread(s) the file does not list" if result.closed else "")
    )
    return 0


def _spool_stdin(path: str) -> None:
    with Path(path).open("wb") as spool:
        shutil.copyfileobj(sys.stdin.buffer, spool)


async def _rewind(conversation: ConversationStore, state: StateStore, args: argparse.Namespace) -> int:
    result = await retry_transient(
        lambda: rewind_thread(
            conversation, state, args.thread, args.order, expected_version=args.expected_version
        )
    )
    if result.dropped_rows == 0:
        print(f"thread {result.thread_id} already ends at order {result.effective}; nothing changed")
        return 0
    moved = "" if result.effective == result.requested else f" (moved from {result.requested}: inside a pair)"
    extras = [f"{len(result.closed_threads)} child thread(s) closed"] if result.closed_threads else []
    if result.cleanup.intents:
        extras.append(f"{len(result.cleanup.intents)} pending dispatch(es) cancelled")
    if result.summaries_removed:
        extras.append(f"{len(result.summaries_removed)} summary(ies) dropped")
    print(
        f"rewound thread {result.thread_id} to order {result.effective}{moved}: {result.dropped_rows} row(s) "
        f"dropped" + (f"; {', '.join(extras)}" if extras else "")
    )
    return 0
