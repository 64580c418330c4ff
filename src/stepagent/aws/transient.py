"""Which AWS failures are worth trying again a moment later, and the loop that does it for the commands
and the client (``export``, ``import``, ``rewind``, ``dlq redrive``, :class:`stepagent.client.Client`).

Guarantees: :func:`is_transient` is true for an error that is, or was raised from (``raise ... from``, as
the stores and the SQS sender wrap what the SDK raises), a DynamoDB ``TransactionConflict``
(:class:`~stepagent.errors.TransactionConflictError`), throttling, a 5xx answer, or a connection or read
failure: failures another try can get past. Everything else — a missing table, a refused permission, a
failed condition, bad input — is not, and fails at once with its own message. :func:`retry_transient` runs
an operation through the one backoff rule (:mod:`stepagent.backoff`) while it fails transiently; the
operation must be safe to run again (an idempotent read or write, a send with a stable dedup id).

The SDK's own retries (standard mode, four attempts) already absorb short throttling and 5xx bursts of one
call; this loop is the outer one, spaced out over seconds, and the only one that retries a transaction
DynamoDB cancelled for a conflict (the SDK does not).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

from stepagent.backoff import Backoff, retry
from stepagent.errors import TransactionConflictError

T = TypeVar("T")

#: How the commands and the client retry a transient failure: five runs, waits of 0.2, 0.4, 0.8 and 1.6 s
#: (jittered down by up to a fifth) between them.
TRANSIENT_BACKOFF = Backoff(attempts=5, base=0.2, cap=3.0)

#: Error codes AWS answers with for "slow down" and "try later" (DynamoDB, SQS, S3 and the generic ones),
#: some of them sent with a 4xx status.
_TRANSIENT_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "SlowDown",
        "LimitExceededException",
        "TransactionInProgressException",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is a failure a later try can get past."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, TransactionConflictError | ConnectionError | HTTPClientError):
            return True
        if isinstance(seen, ClientError):
            code = str(seen.response.get("Error", {}).get("Code", ""))
            status = seen.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return code in _TRANSIENT_CODES or (isinstance(status, int) and status >= 500)
        seen = seen.__cause__
    return False


async def retry_transient(
    operation: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Run ``operation``, again after a jittered wait each time it fails transiently (:func:`is_transient`),
    ``backoff.attempts`` runs at most (default :data:`TRANSIENT_BACKOFF`); the last failure, or the first
    other one, is raised."""
    return await retry(operation, when=is_transient, backoff=backoff or TRANSIENT_BACKOFF, sleep=sleep)
