"""``stepagent run``: chat with an agent on the local stack, through the real AWS code paths.

Messages go onto the SQS FIFO input queue; the worker, the tool runner and the timer relay are fed by
local stand-ins for Lambda's SQS event source (:mod:`stepagent.devstack.services`); the conversation is
read back by :mod:`stepagent.client` and shown by its terminal chat (:mod:`stepagent.client.terminal`),
the same code as ``stepagent chat`` against a deployment. So what you see is what a deployment does —
only the queues and tables are local (moto, or LocalStack via ``AWS_ENDPOINT_URL``).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources

from stepagent.aws.settings import Settings
from stepagent.devstack import terminal_logs
from stepagent.devstack.stack import EmbeddedMoto, create_resources, use_fake_credentials
from stepagent.errors import ConfigurationError
from stepagent.providers.base import ModelProvider
from stepagent.transcript import Item

LOCAL_PREFIX = "stepagent-local"

#: What ``run`` can run on the local stack instead of the terminal chat: ``(settings, thread id, --say texts)``.
Session = Callable[[Settings, str, list[str]], Awaitable[int]]


def demo_script_path() -> str:
    """The path of the demo model's script, shipped in the package."""
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


async def run_chat(
    *,
    say: list[str],
    thread_id: str | None,
    idle_timeout: float,
    debug: bool,
    debug_sdk: bool = False,
    state_dir: str | None = None,
    session: Session | None = None,
    trace: bool = False,
) -> int:
    """Start the local stack and chat on it — or, with ``session``, run that instead of the terminal chat
    once the services are up (``run --console``: the web console). ``trace``: print each turn's span tree
    at the end. The ``OTEL_*`` variables export the spans to a collector, as in Lambda."""
    terminal_logs.configure(debug=debug, debug_sdk=debug_sdk)
    terminal_logs.adopt_powertools_loggers(debug=debug)
    model, demo = choose_model(os.environ)
    validate_before_start(model, demo=demo)
    # Build the model provider before the local stack swaps in throwaway credentials: a bedrock: model
    # needs the real AWS credentials, while the tables and queues live on the local endpoint.
    provider = _bedrock_with_real_credentials(model) if model.startswith("bedrock:") else None
    check_window(model, provider)
    chat = _StartChat(model, demo, provider, say, thread_id, idle_timeout, session, trace, state_dir)
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
    session: Session | None = None
    trace: bool = False
    state_dir: str | None = None

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
            session=self.session,
            trace=self.trace,
            state_dir=self.state_dir,
        )


def _decide_later(state_dir: str | None) -> Callable[[Item], str]:
    """What `run` tells the person about a call still waiting when its standard input ends: with a state
    dir, the command that decides it there; without one the local stack (and the call) ends with `run`."""

    def hint(waiting: Item) -> str:
        thread, call = waiting["thread_id"], waiting["tool_call_id"]
        if state_dir is not None:
            return (
                f"the call keeps waiting in {state_dir}; decide it with `stepagent approve {thread} {call} "
                f"--state-dir {state_dir}` [--reject [MSG] | --edit JSON | --respond TEXT], or answer it "
                f"in `stepagent run --state-dir {state_dir} --thread {thread}`"
            )
        return (
            "this run's local stack, and the waiting call, end with it: answer on standard input "
            "(e.g. `echo y | stepagent run --say ...`), or keep the state with --state-dir DIR and decide "
            f"later with `stepagent approve {thread} {call} --state-dir DIR`"
        )

    return hint


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


def validate_before_start(model: str, *, demo: bool = False) -> None:
    """Check every setting that can be checked without the stack (model, tools, agent settings, MCP and
    RAP settings, approval entries and dollar limits), so a mistake is reported at once, not after the
    local stack has started. Approval entries are checked here only when every tool is known now (no RAP
    or MCP servers, not the demo, whose tools come from servers): otherwise the worker checks them when it
    starts, before the first message."""
    from stepagent.core.agents import fail_closed_problems
    from stepagent.providers.factory import make_provider
    from stepagent.tools.base import Toolset
    from stepagent.tools.builtins import builtin_tools
    from stepagent.tools.functions import load_toolset
    from stepagent.tools.sleep import Sleep, SleepUntil

    settings = Settings.from_env({**os.environ, "STEPAGENT_MODEL": model})
    agent = settings.agent_config()
    user_tools = load_toolset(settings.tools) if settings.tools else []
    name = model
    if not model.startswith("bedrock:"):
        name = make_provider(model).info.name  # names a missing API key or a bad script; no network
    remote = bool(settings.rap_servers or settings.mcp_servers) or demo
    toolset = None if remote else Toolset.of([*builtin_tools(), Sleep(), SleepUntil(), *user_tools])
    problems = fail_closed_problems(agent, toolset, name, settings.prices)
    if problems:
        raise ConfigurationError("\n".join(problems))


def check_window(model: str, provider: ModelProvider | None = None) -> None:
    """Fail before the stack starts when the model's known window cannot hold even the fixed part of a
    request (system prompt, tool schemas, output reserve): every turn would end with that error. MCP
    servers' tools are not known yet and are not counted."""
    from stepagent.core.agents import resolve_agent, window_problem
    from stepagent.providers.factory import make_provider
    from stepagent.tools.base import Toolset
    from stepagent.tools.builtins import builtin_tools
    from stepagent.tools.functions import load_toolset
    from stepagent.tools.sleep import Sleep, SleepUntil

    settings = Settings.from_env({**os.environ, "STEPAGENT_MODEL": model})
    user_tools = load_toolset(settings.tools) if settings.tools else []
    toolset = Toolset.of([*builtin_tools(), Sleep(), SleepUntil(), *user_tools])
    chosen = provider if provider is not None else make_provider(model)
    agent = resolve_agent(settings.agent_config(), chosen, toolset, {}, metadata=None, child=False)
    problem = window_problem(agent, root_thread_id=f"chat-{uuid.uuid4().hex[:8]}")
    if problem is not None:
        raise ConfigurationError(problem)


def _bedrock_with_real_credentials(model: str) -> ModelProvider:
    import botocore.session

    from stepagent.providers.factory import make_provider

    credentials = botocore.session.get_session().get_credentials()
    frozen = credentials.get_frozen_credentials() if credentials is not None else None
    if frozen is None or frozen.access_key is None or frozen.secret_key is None:
        raise ConfigurationError(
            f"STEPAGENT_MODEL={model} needs AWS credentials (environment, profile or SSO) to call Bedrock"
        )
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


async def _chat(
    settings: Settings,
    *,
    say: list[str],
    thread_id: str,
    idle_timeout: float,
    demo: bool,
    provider: ModelProvider | None,
    session: Session | None = None,
    trace: bool = False,
    state_dir: str | None = None,
) -> int:
    """Run the local services and chat through :mod:`stepagent.client`, as against a deployment (or run
    ``session`` on them)."""
    from stepagent import telemetry
    from stepagent.client import Client
    from stepagent.client.terminal import chat
    from stepagent.devstack.services import local_services

    tracer = telemetry.tracer_from_env()
    kept = None
    if trace:
        from stepagent.telemetry.otel import OtelTracer, SpanBuffer

        tracer = (
            tracer if tracer is not None else OtelTracer(None, capture_content=telemetry.captures_content())
        )
        kept = SpanBuffer()
        tracer.provider.add_span_processor(kept)
    if state_dir and not settings.state_dir:
        # "auth": "oauth" MCP servers keep users' tokens under the state directory's local key.
        settings = dataclasses.replace(settings, state_dir=state_dir)
    try:
        async with local_services(settings, demo=demo, provider=provider, tracer=tracer) as services:
            if session is not None:
                return await session(services.settings, thread_id, say)
            print(
                f"conversation {thread_id} — "
                + ("type a message (Ctrl-D to quit)" if not say else "sending"),
                file=sys.stderr,
            )
            async with Client(services.settings) as client:
                return await chat(
                    client, thread_id, say=say, timeout=idle_timeout, decide_later=_decide_later(state_dir)
                )
    finally:
        if kept is not None:
            from stepagent.telemetry.tree import render

            print("\n".join(["", "── trace ──", *render(kept.take())]))
