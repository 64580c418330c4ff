"""Transient AWS faults injected in front of real clients on moto: the first N calls of chosen operations
fail as AWS answers when it throttles (or with a 5xx), through botocore's ``before-call`` event, so every
layer above the SDK (stores, senders, commands, the client) sees exactly what a real throttled call
raises once the SDK's own retries are spent."""

from __future__ import annotations

from collections import Counter
from typing import Any

from botocore.exceptions import ClientError


class Faults:
    """Fails ``failures[operation]`` calls in a row of each named operation (``"Query"``,
    ``"SendMessage"``, ...) with ``code`` and HTTP ``status``, after letting the first ``after[operation]``
    (default 0) through; ``calls`` counts every call of those operations, ``injected`` the failed ones."""

    def __init__(
        self,
        failures: dict[str, int],
        code: str = "ThrottlingException",
        status: int = 400,
        after: dict[str, int] | None = None,
    ) -> None:
        self.failures, self.code, self.status = dict(failures), code, status
        self.after = dict(after or {})
        self.calls: Counter[str] = Counter()
        self.injected = 0

    def hook(self, model: Any, **_: Any) -> None:
        name = model.name
        if name not in self.failures:
            return
        self.calls[name] += 1
        skip = self.after.get(name, 0)
        if skip < self.calls[name] <= skip + self.failures[name]:
            self.injected += 1
            raise ClientError(
                {
                    "Error": {"Code": self.code, "Message": "Rate exceeded (injected)"},
                    "ResponseMetadata": {"HTTPStatusCode": self.status},
                },
                name,
            )

    def attach(self, target: Any) -> Faults:
        """Install on a client (``client.meta.events``) or a session (an aioboto3 session or the runtime's
        ``AwsSession``: every client it creates afterwards)."""
        session = getattr(target, "session", target)
        events = target.meta.events if hasattr(target, "meta") else session.events
        events.register("before-call", self.hook)
        return self
