"""What a step is given and what it reports: :class:`StepConfig`, :class:`StepInput`, :class:`StepOutcome`.

What it guarantees: a :class:`StepConfig` that was built can serve every agent profile it names (building
it checks them, ``ConfigurationError`` otherwise), so a step never finds out mid-run that a profile's
model or tools are missing. :class:`~stepagent.core.step.ThreadStep` runs the step; these types are
re-exported there, where callers import them from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from stepagent.agent_config import AgentConfig
from stepagent.core.agents import check_agents
from stepagent.core.completion import RetryPolicy
from stepagent.core.thread_cache import ThreadCache
from stepagent.messages import InputMessage
from stepagent.providers.base import ModelProvider, Usage
from stepagent.providers.prices import CATALOG_PRICES, PriceTable
from stepagent.senders.base import InputSender
from stepagent.tools.base import FunctionRunner, LifecycleNotifier, TimerBackend, Toolset
from stepagent.tracing import Tracer


@dataclass(slots=True)
class StepConfig:
    """Everything a step needs besides the stores.

    ``provider`` is the default agent's model and ``toolset`` every tool the deployment has (what a thread
    is offered is chosen per thread from ``agent``: :mod:`stepagent.core.agents`). ``providers`` holds the
    models of profiles that name one (``<provider>:<model id>`` → provider). ``tracer`` receives the
    spans of steps, model calls and tool runs (none: no tracing). Building a config checks that every
    profile can be served (``ConfigurationError`` otherwise)."""

    provider: ModelProvider
    toolset: Toolset
    sender: InputSender
    agent: AgentConfig = field(default_factory=AgentConfig)
    providers: Mapping[str, ModelProvider] = field(default_factory=dict)
    callback_url: str | None = None
    timers: TimerBackend | None = None
    runner: FunctionRunner | None = None
    notifier: LifecycleNotifier | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    tracer: Tracer | None = None
    compaction_lease_seconds: float = 3600.0
    clock: Callable[[], float] = time.time
    #: A warm worker's cache of loaded threads (``core/thread_cache.py``); ``None``: every step reads all.
    thread_cache: ThreadCache | None = None
    #: Model prices, for ``cost_usd`` in usage records and events and for the conversation cost limit.
    prices: PriceTable = CATALOG_PRICES

    def __post_init__(self) -> None:
        check_agents(
            self.agent,
            self.toolset,
            self.providers,
            default_model=self.provider.info.name,
            prices=self.prices,
        )


@dataclass(slots=True)
class StepOutcome:
    """What one step of one thread did: whether it ran to its commit, the model usage, the error if any."""

    thread_id: str
    completed: bool = False
    usage: Usage | None = None
    context_window: int = 0
    error: str | None = None


@dataclass(frozen=True, slots=True)
class StepInput:
    """One input of a step: the message, its logical id (the dedup id every redelivery carries) and the
    W3C trace context it arrived with (``None``: it starts a trace of its own)."""

    message: InputMessage
    message_id: str
    traceparent: str | None = None
