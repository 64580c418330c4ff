"""Serving the console: open the AWS clients it needs besides the client's, say where it runs, serve.

:func:`open_console` serves on this event loop until the context exits and yields the URL (the tests and
``stepagent run --console`` use it); :func:`serve_console` is ``stepagent console``: it prints the URL and
that the console is local-only (unless ``--host`` says otherwise), then serves until Ctrl-C.

The page header names what the console talks to: the local endpoint (moto, LocalStack), or — against AWS
— the stack and the account of the caller's credentials (STS ``GetCallerIdentity``) and the region.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from stepagent.aws.clients import aws_session, client
from stepagent.aws.settings import Settings
from stepagent.client import Client
from stepagent.console import DEFAULT_PORT, pages
from stepagent.console.app import ConsoleState, build_app
from stepagent.console.dead_letters import DeadLetters
from stepagent.rap.server import is_loopback, serve_in_background

if TYPE_CHECKING:  # the types-aiobotocore stubs: a development dependency, never imported at run time
    from types_aiobotocore_sts import STSClient

__all__ = ["DEFAULT_PORT", "describe_target", "is_loopback", "open_console", "serve_console"]


async def describe_target(settings: Settings, stack: str | None, sts: STSClient | None) -> str:
    """The header's text: which stack, endpoint or AWS account the console acts on (plain text: the page
    template escapes it)."""
    if settings.endpoint_url:
        return f"local endpoint {settings.endpoint_url}"
    region = settings.region or "us-east-1"
    try:
        if sts is None:
            raise ValueError("no STS client to ask")
        identity = await sts.get_caller_identity()
        account = f"AWS account {identity['Account']} ({identity.get('Arn', '')})"
    except Exception as error:
        account = f"AWS account unknown ({error})"
    where = f"stack {stack} · " if stack else ""
    return f"{where}{account} · {region}"


@contextlib.asynccontextmanager
async def open_console(
    console_client: Client, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, stack: str | None = None
) -> AsyncIterator[str]:
    """Serve the console of the open ``console_client`` on ``host:port`` (0: a free port); yields its URL."""
    settings = console_client.settings
    async with contextlib.AsyncExitStack() as stack_:
        session = aws_session(settings)
        sqs = await stack_.enter_async_context(client(session, "sqs", settings))
        sts = (
            None
            if settings.endpoint_url
            else await stack_.enter_async_context(client(session, "sts", settings))
        )
        state = ConsoleState(console_client, DeadLetters(sqs, settings), loopback_only=is_loopback(host))
        state.header = await describe_target(settings, stack, sts)
        yield await stack_.enter_async_context(
            serve_in_background(build_app(state), host, port, lifespan="off")
        )


async def serve_console(
    console_client: Client,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    stack: str | None = None,
    thread: str | None = None,
) -> int:
    """``stepagent console``: serve until Ctrl-C (the client must be open)."""
    async with open_console(console_client, host=host, port=port, stack=stack) as url:
        page = url + (pages.path("c", thread) if thread else "/")
        print(f"stepagent console: {page}", file=sys.stderr)
        if is_loopback(host):
            print(f"local only: listening on {host} (use --host to change); Ctrl-C to stop", file=sys.stderr)
        else:
            print(
                f"WARNING: listening on {host}: anyone who can reach this port can read and act on your "
                "conversations with your AWS credentials (a CSRF token guards the actions); Ctrl-C to stop",
                file=sys.stderr,
            )
        await asyncio.Event().wait()
    return 0
