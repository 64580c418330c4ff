"""``stepagent run``: chat with an agent on the embedded local stack — the main job — or, with
``--console`` or ``--api``, serve the web console or the HTTP API on it instead of the terminal chat."""

from __future__ import annotations

import argparse
import os
from collections.abc import Coroutine
from typing import Any

from stepagent.commands.local_state import add_state_dir
from stepagent.commands.servers import console_options

#: ``--say``'s help, shared with ``chat``.
SAY_HELP = "send TEXT, print the replies until the agent is idle (repeatable), then exit"


def register(subparsers: Any) -> None:
    """Add ``run``."""
    run = subparsers.add_parser(
        "run",
        help="chat with an agent on the embedded local stack (moto, or AWS_ENDPOINT_URL)",
        description=(
            "Start a local stack (moto server on loopback unless AWS_ENDPOINT_URL points at one, e.g. "
            "LocalStack), create the tables and queues, run the worker, tool runner and timer relay, and chat. "
            "Without a model configured it runs the bundled offline demo."
        ),
    )
    run.add_argument("--say", action="append", default=[], metavar="TEXT", help=SAY_HELP)
    run.add_argument("--thread", default=None, help="the conversation (root thread) id; default: a new one")
    run.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the agent to go idle after each message",
    )
    add_state_dir(
        run,
        "keep the embedded stack's state in DIR across runs (default: $STEPAGENT_STATE_DIR; "
        "without it the local state is gone at exit)",
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
    console_options(run)
    run.add_argument(
        "--api",
        action="store_true",
        help="serve the HTTP API and its chat page on the local stack instead of the terminal chat "
        "(port --api-port; prints a dev token)",
    )
    run.add_argument("--api-port", type=int, default=None, help="the HTTP API's port (default 8788)")
    run.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> Coroutine[Any, Any, int]:
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
