"""The one backoff rule (:mod:`stepagent.backoff`): growth, cap, jitter bounds, Retry-After, attempts and
the deadline — and that the model completion's and the RAP client's retries are this rule."""

from __future__ import annotations

import pytest

from stepagent.backoff import Backoff
from stepagent.core.completion import RetryPolicy
from stepagent.errors import ProviderError
from stepagent.tools.rap_http import RAP_BACKOFF, RapHttp


def test_delays_grow_by_the_factor_up_to_the_cap_jittered_never_above_nominal() -> None:
    backoff = Backoff(attempts=10, base=1.0, factor=2.0, cap=5.0, jitter=0.2)
    for attempt, nominal in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (9, 5.0)]:
        delays = {backoff.delay(attempt) for _ in range(200)}
        assert all(0.8 * nominal <= d <= nominal for d in delays), (attempt, min(delays), max(delays))
        assert len(delays) > 1  # jittered: concurrent retries spread apart
    assert Backoff(jitter=0.0).delay(3) == 4.0


def test_a_servers_retry_after_is_honoured_up_to_the_cap() -> None:
    backoff = Backoff(cap=30.0)
    assert backoff.delay(1, retry_after=7.0) == 7.0
    assert backoff.delay(1, retry_after=0.0) == 0.0
    assert backoff.delay(1, retry_after=120.0) == 30.0
    assert 0.8 <= backoff.delay(1, retry_after=-1.0) <= 1.0  # a nonsense value is ignored


def test_attempts_and_the_deadline_bound_the_retries() -> None:
    backoff = Backoff(attempts=3)
    assert backoff.allows(1, 1.0) and backoff.allows(2, 1.0) and not backoff.allows(3, 1.0)
    assert backoff.allows(1, 2.0, remaining=12.5, margin=10.0)
    assert not backoff.allows(1, 3.0, remaining=12.5, margin=10.0)  # the wait would eat into the margin


@pytest.mark.parametrize("retry_after", [None, 3.0])
def test_the_completions_retry_policy_is_this_rule(retry_after: float | None) -> None:
    policy = RetryPolicy(
        max_attempts=3, base_delay=2.0, max_delay=8.0, safety_margin=5.0, remaining=lambda: 9.0
    )
    error = ProviderError("overloaded", retryable=True, retry_after=retry_after)
    delay = policy.delay(2, error)
    assert delay == retry_after if retry_after is not None else 3.2 <= delay <= 4.0
    assert policy.allows(1, 3.9) and not policy.allows(1, 4.1) and not policy.allows(3, 0.0)


def test_the_rap_client_uses_the_shared_rule_with_jitter() -> None:
    assert isinstance(RAP_BACKOFF, Backoff) and RAP_BACKOFF.jitter > 0
    assert RapHttp(client=None).retry is RAP_BACKOFF  # type: ignore[arg-type]
