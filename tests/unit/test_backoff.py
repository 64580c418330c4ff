"""The one backoff rule (:mod:`stepagent.backoff`): growth, cap, jitter bounds, Retry-After, attempts and
the deadline — and that the model completion's and the RAP client's retries are this rule."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from stepagent.aws.transient import is_transient
from stepagent.backoff import Backoff, retry
from stepagent.core.completion import RetryPolicy
from stepagent.errors import ProviderError, StoreError, TransactionConflictError
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


async def test_retry_runs_again_only_on_what_it_is_told_to_and_stops_after_the_attempts() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise TimeoutError("slow")
        return "done"

    rule = Backoff(attempts=4, base=1.0, jitter=0.0)
    assert await retry(flaky, when=lambda e: isinstance(e, TimeoutError), backoff=rule, sleep=sleep) == "done"
    assert calls == 3 and waits == [1.0, 2.0]

    calls, waits[:] = -10, []
    with pytest.raises(TimeoutError):
        await retry(flaky, when=lambda e: isinstance(e, TimeoutError), backoff=rule, sleep=sleep)
    assert calls == -6 and waits == [1.0, 2.0, 4.0]  # four runs, three waits, the last error raised

    calls = 0
    with pytest.raises(TimeoutError):  # an error the predicate refuses is raised at once
        await retry(flaky, when=lambda e: False, backoff=rule, sleep=sleep)
    assert calls == 1


def aws_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


def wrapped(cause: BaseException) -> StoreError:
    try:
        raise StoreError("DynamoDB Query failed") from cause
    except StoreError as error:
        return error


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (aws_error("ThrottlingException", 400), True),
        (aws_error("ProvisionedThroughputExceededException", 400), True),
        (aws_error("RequestLimitExceeded", 400), True),
        (aws_error("InternalServerError", 500), True),
        (aws_error("ServiceUnavailable", 503), True),
        (wrapped(aws_error("ThrottlingException", 400)), True),  # as the stores and senders raise it
        (TransactionConflictError("another transaction touched it"), True),
        (EndpointConnectionError(endpoint_url="http://localhost:1"), True),
        (ReadTimeoutError(endpoint_url="http://localhost:1"), True),
        (aws_error("ResourceNotFoundException", 400), False),  # a missing table: no wait helps
        (wrapped(aws_error("AccessDeniedException", 400)), False),
        (aws_error("ValidationException", 400), False),
        (StoreError("no blob bucket is configured"), False),
        (ValueError("bad"), False),
    ],
)
def test_which_aws_failures_are_transient(error: BaseException, transient: bool) -> None:
    assert is_transient(error) is transient
