"""Typed settings, read once from the environment at cold start.

Every ``STEPAGENT_*`` variable of the contract lives here. A missing or invalid value fails at start with
one :class:`~stepagent.errors.ConfigurationError` that names the variable and says what is expected —
never later, in the middle of a step. Handlers ask only for what they use (``require``), so the timer
relay does not need a model configured.

The agent settings (``STEPAGENT_SYSTEM_PROMPT``, ``STEPAGENT_MAX_TOKENS``, ``STEPAGENT_TEMPERATURE``,
``STEPAGENT_CONTEXT_WINDOW``, ``STEPAGENT_COMPACTION_THRESHOLD``, ``STEPAGENT_BUILTIN_TOOLS``,
``STEPAGENT_PROFILES``, ``STEPAGENT_PROMPT_CACHE_TTL``) are kept as read and become one :class:`~stepagent.agent_config.AgentConfig`
through :meth:`Settings.agent_config`, which the worker calls at cold start: every bad value is reported
there, one line each, and ``@path`` files are read only then (so ``stepagent history`` run from another
directory does not need the prompt file). An unknown ``STEPAGENT_*`` variable is logged as a warning
naming the closest valid one (a typo would otherwise be silently ignored).
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from stepagent.agent_config import AGENT_SETTING_NAMES, AgentConfig, agent_config_from_env, search_roots
from stepagent.core.thread_cache import DEFAULT_CACHE_BYTES
from stepagent.errors import ConfigurationError
from stepagent.providers.prices import CATALOG_PRICES, PRICES_SETTING, PriceTable, parse_prices
from stepagent.tools.mcp_config import McpServer, parse_mcp_servers

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Seconds an older MCP server's call is held open for the user's answer (``STEPAGENT_MCP_INPUT_WAIT``).
DEFAULT_MCP_INPUT_WAIT = 120.0

SETTING_NAMES = (
    "STEPAGENT_CONVERSATION_TABLE",
    "STEPAGENT_STATE_TABLE",
    "STEPAGENT_INPUT_QUEUE_URL",
    "STEPAGENT_OUTPUT_QUEUE_URL",
    "STEPAGENT_DELAY_QUEUE_URL",
    "STEPAGENT_TOOL_QUEUE_URL",
    "STEPAGENT_BLOB_BUCKET",
    "STEPAGENT_MODEL",
    "STEPAGENT_TOOLS",
    "STEPAGENT_RAP_SERVERS",
    "STEPAGENT_CALLBACK_URL",
    "STEPAGENT_CALLBACK_SECRET",
    "STEPAGENT_MCP_SERVERS",
    "STEPAGENT_MCP_INPUT_WAIT",
    "STEPAGENT_OAUTH_KEY_ID",
    "STEPAGENT_API_URL",
    "STEPAGENT_CALLBACK_SECRET_ID",
    "STEPAGENT_PROVIDER_API_KEY_ID",
    "STEPAGENT_LIVE_TEXT",
    PRICES_SETTING,
    *AGENT_SETTING_NAMES,
)
#: Every ``STEPAGENT_*`` name something reads (the contract's, the template's and the test knobs').
KNOWN_NAMES = frozenset(
    {
        *SETTING_NAMES,
        "STEPAGENT_SCHEDULER_ROLE_ARN",
        "STEPAGENT_SCHEDULER_DLQ_ARN",
        "STEPAGENT_OTLP_HEADERS_SECRET_ID",
        "STEPAGENT_MAX_RECEIVE_COUNT",
        "STEPAGENT_THREAD_CACHE_BYTES",
        "STEPAGENT_STATE_DIR",
        "STEPAGENT_CRASH_SEED",
        "STEPAGENT_CRASH_RUNS",
        "STEPAGENT_MOTO_CRASH_RUNS",
        "STEPAGENT_SOAK",
        # The HTTP API's own settings (stepagent.api.auth reads them).
        "STEPAGENT_API_AUTH",
        "STEPAGENT_JWT_JWKS_URL",
        "STEPAGENT_JWT_PUBLIC_KEY",
        "STEPAGENT_JWT_ISSUER",
        "STEPAGENT_JWT_AUDIENCE",
        "STEPAGENT_JWT_OWNER_CLAIM",
        # stepagent.api.policy reads it.
        "STEPAGENT_API_PROFILES",
        # The HTTP API's per-subject quotas (stepagent.api.quotas reads them).
        "STEPAGENT_API_MAX_NEW_THREADS_PER_MINUTE",
        "STEPAGENT_API_MAX_MESSAGES_PER_MINUTE",
        "STEPAGENT_API_MAX_OPEN_STREAMS",
        "STEPAGENT_API_MAX_COST_USD_PER_DAY",
    }
)

#: The input queue's ``maxReceiveCount`` when ``STEPAGENT_MAX_RECEIVE_COUNT`` is not set (template.yaml's).
DEFAULT_MAX_RECEIVE_COUNT = 5


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of a process, as :meth:`from_env` reads them from the ``STEPAGENT_*`` environment."""

    conversation_table: str | None = None
    state_table: str | None = None
    input_queue_url: str | None = None
    output_queue_url: str | None = None
    delay_queue_url: str | None = None
    tool_queue_url: str | None = None
    blob_bucket: str | None = None
    model: str | None = None
    tools: str | None = None
    rap_servers: tuple[str, ...] = ()
    callback_url: str | None = None
    callback_secret: str | None = None
    # Ids of secrets read at cold start (stepagent.aws.secrets); provider_api_key is filled from the second.
    callback_secret_id: str | None = None
    provider_api_key_id: str | None = None
    provider_api_key: str | None = None
    mcp_servers: tuple[McpServer, ...] = ()
    endpoint_url: str | None = None
    scheduler_role_arn: str | None = None
    scheduler_dlq_arn: str | None = None
    region: str | None = None
    #: The agent settings as read (name → value), turned into an AgentConfig by :meth:`agent_config`.
    agent_settings: Mapping[str, str] = field(default_factory=dict)
    #: Write the partial text of running completions for clients (``STEPAGENT_LIVE_TEXT``, default on).
    live_text: bool = True
    #: The input queue's maxReceiveCount: on a record's last allowed attempt the worker gives up on it
    #: itself (DLQ copy, ``error`` event with ``retrying: false``), so the thread's later records proceed.
    max_receive_count: int = DEFAULT_MAX_RECEIVE_COUNT
    #: Bytes of loaded threads a warm worker keeps (``STEPAGENT_THREAD_CACHE_BYTES``; 0 turns the cache off).
    thread_cache_bytes: int = DEFAULT_CACHE_BYTES
    #: Model prices: the catalog's, with ``STEPAGENT_PRICES`` overriding the models it names.
    prices: PriceTable = CATALOG_PRICES
    #: Seconds the tool runner holds an older (session) MCP server's call open for the user's answer to
    #: the server's question before it declines (``STEPAGENT_MCP_INPUT_WAIT``, default 120).
    mcp_input_wait: float = DEFAULT_MCP_INPUT_WAIT
    #: The KMS key that seals users' OAuth tokens for ``"auth": "oauth"`` MCP servers
    #: (``STEPAGENT_OAUTH_KEY_ID``; unset: a local key file in ``STEPAGENT_STATE_DIR``).
    oauth_key_id: str | None = None
    #: The HTTP API's public base URL (``STEPAGENT_API_URL``): OAuth sign-ins return to
    #: ``<it>/v1/oauth/callback``.
    api_url: str | None = None
    #: The embedded stack's state directory (``STEPAGENT_STATE_DIR``): where the local token key lives.
    state_dir: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings ``environ`` (default: the process's) holds. Every bad value is reported, one line
        each, in one ``ConfigurationError``."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        problems: list[str] = []

        def checked(read: Callable[[], _T], default: _T) -> _T:
            try:
                return read()
            except ConfigurationError as error:
                problems.append(str(error))
                return default

        warn_unknown_names(env)
        model = checked(lambda: _spec("STEPAGENT_MODEL", get("STEPAGENT_MODEL"), _MODEL_SPEC), None)
        tools = checked(lambda: _spec("STEPAGENT_TOOLS", get("STEPAGENT_TOOLS"), _TOOLS_SPEC), None)
        rap: tuple[str, ...] = checked(
            lambda: _urls("STEPAGENT_RAP_SERVERS", get("STEPAGENT_RAP_SERVERS")), ()
        )
        cache_bytes = checked(
            lambda: _byte_count("STEPAGENT_THREAD_CACHE_BYTES", get("STEPAGENT_THREAD_CACHE_BYTES")), 0
        )
        receive_count = checked(
            lambda: _positive_int("STEPAGENT_MAX_RECEIVE_COUNT", get("STEPAGENT_MAX_RECEIVE_COUNT")), None
        )
        mcp_servers: tuple[McpServer, ...] = checked(
            lambda: parse_mcp_servers(get("STEPAGENT_MCP_SERVERS")), ()
        )
        live_text = checked(
            lambda: _switch("STEPAGENT_LIVE_TEXT", get("STEPAGENT_LIVE_TEXT"), default=True), True
        )
        prices = checked(lambda: parse_prices(get(PRICES_SETTING)), CATALOG_PRICES)
        mcp_input_wait = checked(
            lambda: _seconds(
                "STEPAGENT_MCP_INPUT_WAIT", get("STEPAGENT_MCP_INPUT_WAIT"), DEFAULT_MCP_INPUT_WAIT
            ),
            DEFAULT_MCP_INPUT_WAIT,
        )
        api_url = checked(lambda: _http_url("STEPAGENT_API_URL", get("STEPAGENT_API_URL")), None)
        if problems:
            raise ConfigurationError("\n".join(problems))
        return cls(
            thread_cache_bytes=cache_bytes,
            max_receive_count=receive_count or DEFAULT_MAX_RECEIVE_COUNT,
            mcp_servers=mcp_servers,
            live_text=live_text,
            prices=prices,
            mcp_input_wait=mcp_input_wait,
            conversation_table=get("STEPAGENT_CONVERSATION_TABLE"),
            state_table=get("STEPAGENT_STATE_TABLE"),
            input_queue_url=get("STEPAGENT_INPUT_QUEUE_URL"),
            output_queue_url=get("STEPAGENT_OUTPUT_QUEUE_URL"),
            delay_queue_url=get("STEPAGENT_DELAY_QUEUE_URL"),
            tool_queue_url=get("STEPAGENT_TOOL_QUEUE_URL"),
            blob_bucket=get("STEPAGENT_BLOB_BUCKET"),
            model=model,
            tools=tools,
            rap_servers=rap,
            callback_url=get("STEPAGENT_CALLBACK_URL"),
            callback_secret=get("STEPAGENT_CALLBACK_SECRET"),
            callback_secret_id=get("STEPAGENT_CALLBACK_SECRET_ID"),
            provider_api_key_id=get("STEPAGENT_PROVIDER_API_KEY_ID"),
            endpoint_url=get("AWS_ENDPOINT_URL"),
            scheduler_role_arn=get("STEPAGENT_SCHEDULER_ROLE_ARN"),
            scheduler_dlq_arn=get("STEPAGENT_SCHEDULER_DLQ_ARN"),
            region=get("AWS_REGION") or get("AWS_DEFAULT_REGION"),
            agent_settings={name: value for name in AGENT_SETTING_NAMES if (value := get(name)) is not None},
            oauth_key_id=get("STEPAGENT_OAUTH_KEY_ID"),
            api_url=api_url,
            state_dir=get("STEPAGENT_STATE_DIR"),
        )

    def agent_config(self, roots: list[Path] | None = None) -> AgentConfig:
        """The agent's configuration from the agent settings: one ``ConfigurationError`` with a line per bad
        value. Relative ``@path`` files are looked for in ``roots`` (default:
        :func:`~stepagent.agent_config.search_roots` for this process and ``STEPAGENT_TOOLS``)."""
        environ = {**self.agent_settings}
        if self.tools:
            environ["STEPAGENT_TOOLS"] = self.tools
        if roots is None:
            roots = search_roots(self.tools)
        return agent_config_from_env(environ, roots=roots)

    def require(self, *names: str) -> None:
        """Fail with one message listing every missing setting among ``names`` (environment names)."""
        missing = [name for name in names if getattr(self, _attribute(name)) in (None, ())]
        if missing:
            raise ConfigurationError(
                "missing required setting"
                + ("s " if len(missing) > 1 else " ")
                + ", ".join(missing)
                + " (set them in the environment; `stepagent infra create` prints the resource ones)"
            )


def _http_url(name: str, raw: str | None) -> str | None:
    if raw is not None and not raw.startswith(("http://", "https://")):
        raise ConfigurationError(f"{name}={raw!r} is invalid: expected an http(s) URL")
    return raw


_warned: set[str] = set()


def unknown_names(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """Each ``STEPAGENT_*`` variable of ``environ`` that nothing reads, with the closest valid name (or
    ``None`` when none is close), sorted by name."""
    unknown = sorted(name for name in environ if name.startswith("STEPAGENT_") and name not in KNOWN_NAMES)
    return [
        (name, next(iter(difflib.get_close_matches(name, sorted(KNOWN_NAMES), n=1, cutoff=0.6)), None))
        for name in unknown
    ]


def unknown_name_text(name: str, closest: str | None) -> str:
    """``unknown setting X is ignored; did you mean Y?``"""
    return f"unknown setting {name} is ignored" + (f"; did you mean {closest}?" if closest else "")


def report_unknown_names(environ: Mapping[str, str], say: Callable[[str], None]) -> list[str]:
    """Tell ``say`` (e.g. a print to stderr) about each unknown ``STEPAGENT_*`` variable, whatever the
    logging configuration; the settings reader then does not log them again. Returns the names."""
    found = unknown_names(environ)
    for name, closest in found:
        _warned.add(name)
        say(unknown_name_text(name, closest))
    return [name for name, _ in found]


def warn_unknown_names(environ: Mapping[str, str]) -> list[str]:
    """Log a warning for each ``STEPAGENT_*`` variable nothing reads, naming the closest valid one (once
    per name and process: settings are read more than once); returns the unknown names."""
    found = unknown_names(environ)
    for name, closest in found:
        if name in _warned:
            continue
        _warned.add(name)
        log.warning("%s", unknown_name_text(name, closest))
    return [name for name, _ in found]


_MODEL_SPEC = "<provider>:<model id>, e.g. anthropic:claude-sonnet-4-5, openai:gpt-4o, bedrock:<model id> or scripted:<path>"
_TOOLS_SPEC = "package.module:name (e.g. myapp.tools:toolset)"


def _spec(name: str, raw: str | None, expected: str) -> str | None:
    """``raw`` if it is a ``left:right`` spec (or unset)."""
    if raw is not None and ":" not in raw:
        raise ConfigurationError(f"{name}={raw!r} is invalid: expected {expected}")
    return raw


def _urls(name: str, raw: str | None) -> tuple[str, ...]:
    """The comma-separated http(s) base URLs of ``raw``, without a trailing slash."""
    urls = tuple(url.strip().rstrip("/") for url in (raw or "").split(",") if url.strip())
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"{name} contains {url!r}, which is not an http(s) URL")
    return urls


def _switch(name: str, raw: str | None, *, default: bool) -> bool:
    if raw is None:
        return default
    value = raw.lower()
    if value in ("on", "true", "1", "yes"):
        return True
    if value in ("off", "false", "0", "no"):
        return False
    raise ConfigurationError(f"{name}={raw!r} is invalid: expected on or off")


def _attribute(name: str) -> str:
    return name.removeprefix("STEPAGENT_").lower()


def _byte_count(name: str, raw: str | None) -> int:
    if raw is None:
        return DEFAULT_CACHE_BYTES
    if not raw.isdigit():
        raise ConfigurationError(f"{name}={raw!r} is invalid: expected a number of bytes (0 or more)")
    return int(raw)


def _seconds(name: str, raw: str | None, default: float) -> float:
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:
        raise ConfigurationError(f"{name}={raw!r} is invalid: expected seconds, a number from 0 to 86400")
    return value


def _positive_int(name: str, raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigurationError(f"{name}={raw!r} is invalid: expected a whole number of at least 1")
    return value
