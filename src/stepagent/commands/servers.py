"""``stepagent api`` (the HTTP API for applications, :mod:`stepagent.api`) and ``stepagent console`` (the
web console, :mod:`stepagent.console`), each served over the deployment the settings or ``--stack`` name."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``api`` and ``console``."""
    api = subparsers.add_parser(
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
    api.set_defaults(run=_api)

    console = subparsers.add_parser(
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
    console_options(console)
    console.set_defaults(run=_console)


def console_options(parser: argparse.ArgumentParser) -> None:
    """The console's ``--host`` and ``--port`` (``console`` and ``run --console``)."""
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


async def _console(args: argparse.Namespace) -> int:
    from stepagent.client import Client
    from stepagent.console.server import serve_console

    async with Client(stack=args.stack) as client:
        return await serve_console(
            client, host=args.host, port=args.port, stack=args.stack, thread=args.thread
        )


async def _api(args: argparse.Namespace) -> int:
    from stepagent.api import DEFAULT_PORT
    from stepagent.api.server import serve_api
    from stepagent.client import Client

    async with Client(stack=args.stack) as client:
        port = DEFAULT_PORT if args.port is None else args.port
        return await serve_api(client, host=args.host, port=port, dev_token=args.dev_token)
