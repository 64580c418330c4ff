"""The threads the release corpus holds: one agent (a scripted model, three function tools) and, for each
point a thread can wait at across a deploy, a thread left there and what it must end with; a second agent
whose threads compact; a third with RAP tools (a call answered later, a subscription) served by
:class:`CorpusRapServer`, whose callbacks reach the RAP receiver through :class:`FunctionUrl`.

Shared by the recorder (:mod:`tests.corpus.record`, run on the previous release's code) and the tests that
continue the recorded threads with today's code (:mod:`tests.corpus.test_corpus`), so both agree on the
agent. Uses only APIs every release so far has had (it is imported by an older ``stepagent``).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from stepagent.rap.server import (
    DEFERRED,
    RapCall,
    RapToolServer,
    Subscription,
    current_call,
    serve_in_background,
)
from stepagent.tools.functions import tool


@tool
def lookup(topic: str) -> str:
    """Data on a topic.

    Args:
        topic: The topic.
    """
    return f"Data on {topic}: 42"


@tool
def transfer(amount: int) -> str:
    """Transfer money (needs a person's approval).

    Args:
        amount: How much.
    """
    return f"Transferred {amount}"


@tool
def big_payload(size: int) -> str:
    """A result of ``size`` characters (claim-checked on the queue and in the stores)."""
    return "y" * size


TOOLS = [lookup, transfer, big_payload]
TOOLS_SPEC = "tests.corpus.scenarios:TOOLS"
#: Settings of the corpus agent besides the stack's resources.
AGENT_ENV = {"STEPAGENT_APPROVAL": "transfer", "STEPAGENT_TOOLS": TOOLS_SPEC}

SCRIPT: dict[str, Any] = {
    "rules": [
        {
            "when": "^look up",
            "on": ["user"],
            "reply": [
                {"text": "Looking."},
                {"tool_call": {"name": "lookup", "arguments": {"topic": "tides"}}},
            ],
        },
        {"when": "^Data on tides", "on": ["tool_result"], "reply": [{"text": "Tides: 42."}]},
        {
            "when": "^pay",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "transfer", "arguments": {"amount": 10}}}],
        },
        {"when": "^Transferred 10", "on": ["tool_result"], "reply": [{"text": "Paid."}]},
        {
            "when": "^nap",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "sleep", "arguments": {"seconds": 1}}}],
        },
        {
            "when": "^hibernate",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "sleep", "arguments": {"seconds": 7200}}}],
        },
        {"when": "^Slept for", "on": ["tool_result"], "reply": [{"text": "Awake."}]},
        {
            "when": "^big",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "big_payload", "arguments": {"size": 260000}}}],
        },
        {"when": "^y{1000}", "on": ["tool_result"], "reply": [{"text": "Got the big one."}]},
        {
            "when": "^delegate",
            "on": ["user"],
            "reply": [
                {"text": "Delegating."},
                {
                    "tool_call": {
                        "name": "spawn_thread",
                        "arguments": {"instructions": "research", "child_of": "{thread_stack}"},
                    }
                },
            ],
        },
        {"when": "successfully spawned", "reply": [{"text": "Spawned a child."}]},
        {
            "when": "You are now INSIDE",
            "reply": [{"tool_call": {"name": "lookup", "arguments": {"topic": "the child's question"}}}],
        },
        {
            "when": "^Data on the child's question",
            "reply": [{"tool_call": {"name": "report_to_parent", "arguments": {"report": "three"}}}],
        },
        {
            "when": "Report sent to parent",
            "reply": [
                {
                    "tool_call": {
                        "name": "close_thread",
                        "arguments": {"thread_id": "{thread_id}", "report_to_parent": "done"},
                    }
                }
            ],
        },
        {"when": "Report from child thread: three", "reply": [{"text": "Got the report."}]},
        {"when": "has shut down", "reply": [{"text": "Child finished."}]},
    ],
    "default": [{"text": "ok"}],
}

#: A second agent whose tiny context window makes every thread compact after a few turns.
COMPACTION_SCRIPT: dict[str, Any] = {
    "context_window": 8000,
    "rules": [
        {
            "when": "INSIDE a compaction thread",
            "reply": [
                {
                    "tool_call": {
                        "name": "close_thread",
                        "arguments": {
                            "thread_id": "{thread_id}",
                            "report_to_parent": "Summary: turns counted.",
                        },
                    }
                }
            ],
        },
        {"when": "^turn", "on": ["user"], "reply": [{"text": "noted " + "n" * 6000}]},
    ],
    "default": [{"text": "ok"}],
}


@dataclass(frozen=True)
class Waiting:
    """A thread left at one waiting point: its id, the user text that leads there, and a text its history
    must hold once it has been driven to the end."""

    point: str
    thread: str
    say: str
    ends_with: str


#: The threads of the main agent, each left where its ``point`` says.
WAITING = (
    Waiting("queued tool", "corpus-tool", "look up the tides", "Tides: 42."),
    Waiting("approval", "corpus-approval", "pay the bill", "Paid."),
    Waiting("short timer (delay queue)", "corpus-nap", "nap a second", "Awake."),
    Waiting("long timer (scheduled)", "corpus-hibernate", "hibernate two hours", "Awake."),
    Waiting("child thread", "corpus-parent", "delegate the research", "Got the report."),
    Waiting("claim-checked tool result", "corpus-big", "big result please", "Got the big one."),
)
#: The thread of the compaction agent, left with a compaction running.
COMPACTING = Waiting("mid-compaction", "corpus-compacting", "turn", "noted")


# ---- remote tools: a RAP call and a subscription ----------------------------------------------------------

#: The deployment's RAP receiver URL and callback key: both outlive a deploy (the secret is the stack's), so
#: the recorder and the replay use the same ones. Callbacks to this URL are routed to the receiver in process.
RAP_CALLBACK_URL = "https://rap-receiver.corpus.invalid/"
RAP_SECRET = "corpus-callback-secret"

RAP_SCRIPT: dict[str, Any] = {
    "rules": [
        {
            "when": "^fetch the report",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "fetch_report", "arguments": {"topic": "tides"}}}],
        },
        {"when": "^Report on tides", "on": ["tool_result"], "reply": [{"text": "Report read."}]},
        {
            "when": "^watch the deploys",
            "on": ["user"],
            "reply": [{"tool_call": {"name": "watch_deploys", "arguments": {}}}],
        },
        {"when": "^Watching the deploys", "on": ["tool_result"], "reply": [{"text": "Watching."}]},
        {"when": "^deploy 42 finished", "on": ["event"], "reply": [{"text": "Deploy noted."}]},
    ],
    "default": [{"text": "ok"}],
}

#: The threads of the RAP agent: one waits on a RAP call's result (the tool server answers later, through
#: the receiver), one holds a subscription whose event has not come yet.
WAITING_ON_RAP = (
    Waiting("RAP call", "corpus-rap", "fetch the report", "Report read."),
    Waiting("pending subscription", "corpus-subscription", "watch the deploys", "Deploy noted."),
)
#: What the tool server sends, later, to each call it holds (by operation).
RAP_REPORT = "Report on tides: 7 metres."
RAP_EVENT = "deploy 42 finished"


class FunctionUrl:
    """A stand-in for the Lambda Function URL in front of the RAP receiver: an ASGI app that hands each
    request, as the Function URL event (payload format 2.0), to :attr:`receiver` (set once it exists)."""

    def __init__(self) -> None:
        self.receiver: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from starlette.requests import Request
        from starlette.responses import Response

        request = Request(scope, receive)
        body = await request.body()
        event = {
            "version": "2.0",
            "rawPath": request.url.path,
            "rawQueryString": request.url.query,
            "queryStringParameters": dict(request.query_params) or None,
            "headers": dict(request.headers),
            "requestContext": {"http": {"method": request.method, "path": request.url.path}},
            "body": base64.b64encode(body).decode(),
            "isBase64Encoded": True,
        }
        result = await self.receiver.handle(event)
        response = Response(result["body"], status_code=result["statusCode"], headers=result.get("headers"))
        await response(scope, receive, send)


class CorpusRapServer:
    """The corpus's RAP tool server. ``fetch_report`` answers later (``DEFERRED``); ``watch_deploys``
    starts a subscription whose events come later. Like a production server it keeps each call's
    invocation (:attr:`held`, by call id) to answer from wherever the answer comes from; its callbacks go
    to :data:`RAP_CALLBACK_URL`, i.e. to :attr:`function_url`."""

    def __init__(self) -> None:
        self.function_url = FunctionUrl()
        self.held: dict[str, dict[str, Any]] = {}
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.function_url))
        self.server = RapToolServer("corpus", description="Corpus tools", http=self.http)

        def hold(call: RapCall) -> None:
            self.held[call.id] = call.invocation.model_dump(mode="json")

        @self.server.tool
        async def fetch_report(topic: str) -> object:
            """A report on a topic (it takes a while: the answer comes back later).

            Args:
                topic: The topic.
            """
            hold(current_call())
            return DEFERRED

        @self.server.tool
        async def watch_deploys() -> Subscription:
            """Subscribe to the deploys (an event per finished deploy)."""

            async def run(call: RapCall) -> None:
                hold(call)

            return Subscription("Watching the deploys.", run)

    async def answer(self, invocation: dict[str, Any]) -> None:
        """What the server sends, later, for a held call: the report, or the subscription's last event."""
        call = self.server.call_for(invocation)
        if invocation["operation"] == "fetch_report":
            await call.send_result(RAP_REPORT)
        else:
            await call.send_event(RAP_EVENT, associative=True, final=True, event_id="deploy-42")


@asynccontextmanager
async def corpus_rap() -> AsyncIterator[tuple[CorpusRapServer, dict[str, str]]]:
    """The corpus RAP server listening on loopback, and the settings that point an agent at it."""
    rap = CorpusRapServer()
    async with rap.http, serve_in_background(rap.server.app) as url:
        yield (
            rap,
            {
                "STEPAGENT_RAP_SERVERS": url,
                "STEPAGENT_CALLBACK_URL": RAP_CALLBACK_URL,
                "STEPAGENT_CALLBACK_SECRET": RAP_SECRET,
            },
        )


@asynccontextmanager
async def rap_receiver(settings: Any, rap: CorpusRapServer) -> AsyncIterator[None]:
    """The receiver Lambda's runtime over the stack named by ``settings`` (the agent's), behind ``rap``'s
    Function URL."""
    from stepagent.aws.rap_receiver import RapReceiverRuntime
    from stepagent.aws.settings import Settings

    names = {
        "STEPAGENT_INPUT_QUEUE_URL": settings.input_queue_url,
        "STEPAGENT_OUTPUT_QUEUE_URL": settings.output_queue_url,
        "STEPAGENT_CONVERSATION_TABLE": settings.conversation_table,
        "STEPAGENT_STATE_TABLE": settings.state_table,
        "STEPAGENT_BLOB_BUCKET": settings.blob_bucket,
        "AWS_ENDPOINT_URL": settings.endpoint_url,
        "AWS_REGION": settings.region,
    }
    env = {name: str(value) for name, value in names.items() if value}
    receiver = await RapReceiverRuntime.create(
        Settings.from_env({**env, "STEPAGENT_CALLBACK_SECRET": RAP_SECRET})
    )
    rap.function_url.receiver = receiver
    try:
        yield
    finally:
        rap.function_url.receiver = None
        await receiver.aclose()
