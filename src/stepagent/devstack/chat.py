"""``stepagent run``: chat with an agent on the local stack, through the real AWS code paths.

Messages go onto the SQS FIFO input queue; the worker, the tool runner and the timer relay are fed by
local stand-ins for Lambda's SQS event source; the agent's output is read back from the output queue. So
what you see is what a deployment does — only the queues and tables are local (moto, or LocalStack via
``AWS_ENDPOINT_URL``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, TextIO

from stepagent.aws.settings import Settings
from stepagent.devstack import terminal_logs
from stepagent.devstack.poller import SqsEventSource
from stepagent.devstack.stack import EmbeddedMoto, create_resources, use_fake_credentials
from stepagent.errors import ConfigurationError
from stepagent.providers.base import ModelProvider

LOCAL_PREFIX = "stepagent-local"


def demo_script_path() -> str:
    return str(resources.files("stepagent") / "demo" / "demo_script.json")


def choose_model(environ: dict[str, str] | os._Environ[str]) -> tuple[str, bool]:
    """The model to run and whether it is the offline demo: ``STEPAGENT_MODEL``, else a provider whose
    API key is present, else the bundled demo script."""
    configured = environ.get("STEPAGENT_MODEL", "").strip()
    if configured:
        return configured, configured.startswith("scripted:") and "demo_script" in configured
    try:
        from stepagent.providers.factory import detect_default_model
    except ImportError:  # providers not installed in this build
        detected = None
    else:
        detected = detect_default_model(dict(environ))
    if detected:
        return detected, False
    return f"scripted:{demo_script_path()}", True


def _clip(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Printer:
    """Renders output-queue events for a person at a terminal."""

    def __init__(self, root_id: str, out: TextIO = sys.stdout) -> None:
        self.root_id = root_id
        self.out = out

    def show(self, event: dict[str, Any]) -> None:
        thread = str(event.get("thread_id", ""))
        who = "agent" if thread == self.root_id else f"[child {thread[:8]}]"
        kind = event.get("type")
        if kind == "text":
            print(f"{who} > {event.get('text', '')}", file=self.out)
        elif kind == "tool_call":
            args = json.dumps(event.get("args") or {}, ensure_ascii=False)
            print(f"{who} ⚙ {event.get('name')}({'' if args == '{}' else args})", file=self.out)
        elif kind == "tool_result":
            print(f"{who} ← {_clip(str(event.get('text', '')))}", file=self.out)
        elif kind == "event":
            print(f"{who} ✉ {_clip(str(event.get('text', '')))}", file=self.out)
        elif kind == "error":
            retrying = " (retrying)" if event.get("retrying") else ""
            print(f"{who} ! {event.get('message')}{retrying}", file=self.out)
        elif kind == "oauth_required":
            print(f"{who} 🔑 authorise at {event.get('auth_url')}", file=self.out)
        elif kind == "view_update":
            print(f"{who} ◇ view {event.get('view_type')} updated", file=self.out)
        elif kind == "user_choice_required":
            choices = ", ".join(f"{i}: {c}" for i, c in enumerate(event.get("choices", [])))
            print(f"{who} ? {event.get('prompt')} [{choices}]", file=self.out)
        self.out.flush()


@dataclass(slots=True)
class LocalServices:
    """The running pieces of the local stack, and how to tell that nothing is left to do."""

    sqs: Any
    settings: Settings
    sources: list[SqsEventSource] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _pending(self, url: str) -> int:
        attributes = await self.sqs.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )
        values = attributes.get("Attributes", {})
        return int(values.get("ApproximateNumberOfMessages", 0)) + int(
            values.get("ApproximateNumberOfMessagesNotVisible", 0)
        )

    async def busy(self) -> bool:
        if any(source.in_flight for source in self.sources):
            return True
        urls = [self.settings.input_queue_url, self.settings.tool_queue_url, self.settings.delay_queue_url]
        for url in urls:
            if url and await self._pending(url):
                return True
        return False

    async def wait_idle(self, limit_seconds: float, settle: float = 1.5) -> bool:
        """Wait until every work queue has been empty for ``settle`` seconds (timers that are not yet due
        do not count: a sleeping agent is idle). ``False`` on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_seconds
        quiet_since: float | None = None
        while loop.time() < deadline:
            if await self.busy():
                quiet_since = None
            else:
                quiet_since = quiet_since or loop.time()
                if loop.time() - quiet_since >= settle:
                    return True
            await asyncio.sleep(0.2)
        return False


async def _drain_outputs(sqs: Any, url: str, printer: Printer, stop: asyncio.Event) -> None:
    while not stop.is_set():
        response = await sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        messages = response.get("Messages", [])
        for message in messages:
            try:
                printer.show(json.loads(message["Body"]))
            except ValueError:
                printer.out.write(f"(unreadable output event: {message['Body'][:200]})\n")
        if messages:
            await sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
            )


async def _every(seconds: float, action: Callable[[], Awaitable[object]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await action()
        except Exception:  # keep the local stack alive; the next tick retries
            logging.getLogger(__name__).exception("periodic task failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)


async def run_chat(
    *,
    say: list[str],
    thread_id: str | None,
    idle_timeout: float,
    debug: bool,
    debug_sdk: bool = False,
    state_dir: str | None = None,
) -> int:
    terminal_logs.configure(debug=debug, debug_sdk=debug_sdk)
    terminal_logs.adopt_powertools_loggers()
    model, demo = choose_model(os.environ)
    validate_before_start(model)
    # Build the model provider before the local stack swaps in throwaway credentials: a bedrock: model
    # needs the real AWS credentials, while the tables and queues live on the local endpoint.
    provider = _bedrock_with_real_credentials(model) if model.startswith("bedrock:") else None
    chat = _StartChat(model, demo, provider, say, thread_id, idle_timeout)
    if state_dir is not None:
        from stepagent.devstack.snapshot import local_state

        print(f"starting the embedded local stack with the state in {state_dir} ...", file=sys.stderr)
        async with local_state(state_dir, save=True, prefix=LOCAL_PREFIX) as env:
            return await chat.start(env)
    moto: EmbeddedMoto | None = None
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if resource_settings(os.environ) and not endpoint:
        raise ConfigurationError(
            "STEPAGENT_* resource settings are set but AWS_ENDPOINT_URL is not: `run` works on a local stack "
            "(set AWS_ENDPOINT_URL to LocalStack or moto, as `stepagent infra create` prints it, or unset them); "
            "to talk to a deployment use `stepagent chat THREAD --stack NAME`"
        )
    if endpoint:
        print(f"using the AWS endpoint at {endpoint}", file=sys.stderr)
    else:
        print("starting the embedded local stack (moto server on loopback) ...", file=sys.stderr)
        moto = EmbeddedMoto()
        endpoint = moto.start()
        use_fake_credentials()
    try:
        given = resource_settings(os.environ)
        if given:
            print("using the tables, queues and bucket named by the STEPAGENT_* settings", file=sys.stderr)
            env = given
        else:
            print("creating tables, queues and bucket ...", file=sys.stderr)
            env = await create_resources(endpoint, LOCAL_PREFIX)
        return await chat.start({**env, "AWS_ENDPOINT_URL": endpoint})
    finally:
        if moto is not None:
            moto.stop()


@dataclass(slots=True)
class _StartChat:
    """The chat, once the stack's settings are known."""

    model: str
    demo: bool
    provider: ModelProvider | None
    say: list[str]
    thread_id: str | None
    idle_timeout: float

    async def start(self, env: dict[str, str]) -> int:
        os.environ.update(env)
        os.environ["STEPAGENT_MODEL"] = self.model
        os.environ.setdefault("STEPAGENT_CALLBACK_SECRET", secrets.token_hex(32))
        settings = Settings.from_env()
        if self.demo:
            print(
                "no model configured and no API key found: running the offline DEMO (scripted model)",
                file=sys.stderr,
            )
        else:
            print(f"model: {self.model}", file=sys.stderr)
        return await _chat(
            settings,
            say=self.say,
            thread_id=self.thread_id or f"chat-{uuid.uuid4().hex[:8]}",
            idle_timeout=self.idle_timeout,
            demo=self.demo,
            provider=self.provider,
        )


#: The settings that name the stack's resources; `run` uses them when all are given (`infra create` prints them).
RESOURCE_SETTINGS = (
    "STEPAGENT_CONVERSATION_TABLE",
    "STEPAGENT_STATE_TABLE",
    "STEPAGENT_INPUT_QUEUE_URL",
    "STEPAGENT_OUTPUT_QUEUE_URL",
    "STEPAGENT_DELAY_QUEUE_URL",
    "STEPAGENT_TOOL_QUEUE_URL",
    "STEPAGENT_BLOB_BUCKET",
)


def resource_settings(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The resource settings already in ``environ`` (all of them, or none: a partial set is an error)."""
    given = {name: environ[name] for name in RESOURCE_SETTINGS if environ.get(name, "").strip()}
    missing = [name for name in RESOURCE_SETTINGS if name not in given]
    if given and missing:
        raise ConfigurationError(
            f"{', '.join(sorted(given))} set but not {', '.join(missing)}: set every resource setting "
            "(`stepagent infra create` prints them all) or none (run creates its own)"
        )
    return given


def validate_before_start(model: str) -> None:
    """Check every setting that can be checked without the stack (model, tools, MCP and RAP settings), so a
    mistake is reported at once, not after the local stack has started."""
    from stepagent.providers.factory import make_provider
    from stepagent.tools.functions import load_toolset

    settings = Settings.from_env({**os.environ, "STEPAGENT_MODEL": model})
    if settings.tools:
        load_toolset(settings.tools)
    if not model.startswith("bedrock:"):
        make_provider(model)  # names a missing API key or a bad script; no network


def _bedrock_with_real_credentials(model: str) -> ModelProvider:
    import boto3

    from stepagent.providers.factory import make_provider

    credentials = boto3.Session().get_credentials()
    if credentials is None:
        raise ConfigurationError(
            f"STEPAGENT_MODEL={model} needs AWS credentials (environment, profile or SSO) to call Bedrock"
        )
    frozen = credentials.get_frozen_credentials()
    environ = {
        "AWS_ACCESS_KEY_ID": frozen.access_key,
        "AWS_SECRET_ACCESS_KEY": frozen.secret_key,
        "AWS_REGION": os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
    }
    if frozen.token:
        environ["AWS_SESSION_TOKEN"] = frozen.token
    if os.environ.get("AWS_ENDPOINT_URL_BEDROCK_RUNTIME"):
        environ["AWS_ENDPOINT_URL_BEDROCK_RUNTIME"] = os.environ["AWS_ENDPOINT_URL_BEDROCK_RUNTIME"]
    return make_provider(model, environ=environ)


async def _serve_tool_servers(
    stack: contextlib.AsyncExitStack, settings: Settings, demo: bool, printer: Printer
) -> Settings:
    """Serve the RAP receiver on loopback (unless ``STEPAGENT_CALLBACK_URL`` points elsewhere) and, for
    the demo, the local RAP tool server; return the settings that point at them."""
    from stepagent.aws.clients import aws_session, client
    from stepagent.devstack.rap_demo_server import build_server
    from stepagent.rap.receiver import ViewUpdate
    from stepagent.rap.receiver_app import receiver_app
    from stepagent.rap.server import serve_in_background
    from stepagent.senders.sqs import SqsSender

    session = aws_session(settings)
    sqs = await stack.enter_async_context(client(session, "sqs", settings))
    s3 = await stack.enter_async_context(client(session, "s3", settings))
    sender = SqsSender(sqs, str(settings.input_queue_url), s3_client=s3, bucket=settings.blob_bucket)

    async def show_view(view: ViewUpdate) -> None:
        printer.show({"type": "view_update", "thread_id": view.thread_id, "view_type": view.view_type})

    if not settings.callback_url:
        app = receiver_app(str(settings.callback_secret), sender, show_view)
        os.environ["STEPAGENT_CALLBACK_URL"] = await stack.enter_async_context(serve_in_background(app))
    if demo and not settings.rap_servers:
        tools_url = await stack.enter_async_context(serve_in_background(build_server().app))
        os.environ["STEPAGENT_RAP_SERVERS"] = tools_url
    return Settings.from_env()


async def _chat(
    settings: Settings,
    *,
    say: list[str],
    thread_id: str,
    idle_timeout: float,
    demo: bool,
    provider: ModelProvider | None,
) -> int:
    from stepagent.aws.runtime import AwsRuntime
    from stepagent.messages import InputMessage

    printer = Printer(thread_id)
    async with contextlib.AsyncExitStack() as stack:
        settings = await _serve_tool_servers(stack, settings, demo, printer)
        runtime = await stack.enter_async_context(AwsRuntime.open(settings, provider=provider))
        sqs = runtime.sqs
        assert settings.input_queue_url and settings.tool_queue_url and settings.delay_queue_url
        assert settings.output_queue_url
        services = LocalServices(sqs, settings)
        services.sources = [
            SqsEventSource(sqs, settings.input_queue_url, runtime.handle_sqs_batch),
            SqsEventSource(sqs, settings.tool_queue_url, runtime.handle_tool_batch, batch_size=1),
            SqsEventSource(sqs, settings.delay_queue_url, runtime.handle_delay_batch),
        ]
        stop = services.stop
        services.tasks = [asyncio.create_task(source.run(stop)) for source in services.sources]
        services.tasks.append(
            asyncio.create_task(_drain_outputs(sqs, settings.output_queue_url, printer, stop))
        )
        # moto never fires EventBridge schedules: deliver due long timers ourselves.
        services.tasks.append(asyncio.create_task(_every(1.0, runtime.deliver_due_schedules, stop)))
        print(
            f"conversation {thread_id} — " + ("type a message (Ctrl-D to quit)" if not say else "sending"),
            file=sys.stderr,
        )
        try:
            async for text in _texts(say):
                if not text.strip():
                    continue
                if say:
                    print(f"you > {text}")
                message_id = str(uuid.uuid4())
                await runtime.sender.send(InputMessage.user_text(thread_id, text, id=message_id), message_id)
                if not await services.wait_idle(idle_timeout):
                    print(f"stepagent: the agent was still busy after {idle_timeout:.0f} s", file=sys.stderr)
                    return 1
                await asyncio.sleep(1.2)  # let the output reader print the last events
        finally:
            stop.set()
            for task in services.tasks:
                task.cancel()
            await asyncio.gather(*services.tasks, return_exceptions=True)
    return 0


async def _texts(say: list[str]) -> AsyncIterator[str]:
    """The ``--say`` texts, or lines typed at the terminal (read off the event loop, so the pollers keep
    running while you type)."""
    if say:
        for text in say:
            yield text
        return
    while True:
        try:
            line = await asyncio.to_thread(input, "you > ")
        except EOFError:
            print(file=sys.stderr)
            return
        yield line
