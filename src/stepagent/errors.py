"""The one error tree of stepagent.

Every error the runtime raises on purpose derives from :class:`StepagentError` and says, through its
``disposition``, what the worker does with the input that caused it::

    StepagentError
    ├── ConfigurationError        fatal    missing/invalid settings; fails at start, names the variable
    ├── InputError                reject   deterministic bad input: DLQ copy + ``error`` event, never retried
    │   ├── MalformedMessageError          body is not JSON / violates the schema (says which field, why)
    │   ├── GroupMismatchError             body ``group_id`` disagrees with the SQS ``MessageGroupId``
    │   ├── PayloadTooLargeError           a payload or row over the configured limits
    │   └── UnknownProfileError            the root's metadata selects an agent profile that is not configured
    ├── RetriesExhaustedError     reject   a record failed transiently on its last allowed attempt
    ├── TransientError            retry    the record fails, SQS redelivers it (DLQ after maxReceiveCount)
    │   ├── StoreError                     a store call failed
    │   ├── ConcurrentWriteError           another writer advanced the thread's head first
    │   └── QueueError                     sending to a queue failed
    ├── ProviderError             retry or reject, by ``retryable``: the model provider failed
    ├── ToolError                 result   becomes an ``Error: ...`` tool result for the model
    └── InvariantViolation        retry    a bug: a runtime rule was broken (never silently ignored)

``disposition`` values: ``"fatal"`` (stop the process), ``"reject"`` (drop the input with a clear error
event), ``"retry"`` (fail the record so the queue redelivers it), ``"result"`` (report to the model).
"""

from __future__ import annotations

from typing import ClassVar, Literal

Disposition = Literal["fatal", "reject", "retry", "result"]


class StepagentError(Exception):
    """Base of every deliberate stepagent error."""

    disposition: ClassVar[Disposition] = "retry"

    @property
    def retryable(self) -> bool:
        return self.disposition == "retry"


class ConfigurationError(StepagentError):
    """A setting is missing or invalid. The message names the variable and what is expected."""

    disposition = "fatal"


class InputError(StepagentError):
    """Deterministic bad input: retrying cannot help, so it is rejected with a clear message."""

    disposition = "reject"


class MalformedMessageError(InputError):
    """An input message body that is not valid JSON or does not match the schema."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class GroupMismatchError(InputError):
    """The body's ``group_id`` names a different thread than the transport's message group."""


class PayloadTooLargeError(InputError):
    """A payload exceeds a size limit that no retry can fix."""


class UnknownProfileError(InputError):
    """The root thread's metadata names an agent profile (``{"profile": ...}``) the configuration lacks."""


class RetriesExhaustedError(StepagentError):
    """A record kept failing transiently and has used its last allowed attempt (the queue's
    maxReceiveCount). The worker gives up on it itself — DLQ copy, ``error`` event with ``retrying:
    false`` naming the attempts — so the thread's later records are not dragged into the DLQ with it."""

    disposition = "reject"

    def __init__(self, message: str, *, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class TransientError(StepagentError):
    """A failure that may succeed on retry (store, queue, network)."""

    disposition = "retry"


class StoreError(TransientError):
    """A conversation- or state-store call failed."""


class ConcurrentWriteError(TransientError):
    """The thread's head version moved under us: another writer committed first.

    The loser's work is discarded; the input is retried from a fresh load, so nothing is lost.
    """


class QueueError(TransientError):
    """Sending a message to a queue failed."""


class ProviderError(StepagentError):
    """The model provider failed. ``retryable`` says whether the same request may succeed later."""

    def __init__(
        self, message: str, *, retryable: bool, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self._retryable = retryable
        self.status = status
        self.retry_after = retry_after  # seconds the provider asked us to wait (``Retry-After``)

    @property
    def retryable(self) -> bool:
        return self._retryable


class ToolError(StepagentError):
    """A tool failed; the model receives ``Error: <message>`` as the call's result."""

    disposition = "result"


class InvariantViolation(StepagentError):
    """A runtime invariant was broken (a bug). Fails the step loudly instead of corrupting history."""

    disposition = "retry"
