"""The one error tree of stepagent.

Every error the runtime raises on purpose derives from :class:`StepagentError` and says, through its
``disposition``, what the worker does with the input that caused it::

    StepagentError
    ├── ConfigurationError        fatal    missing/invalid settings; fails at start, names the variable
    ├── InputError                reject   deterministic bad input: DLQ copy + ``error`` event, never retried
    │   ├── MalformedMessageError          body is not JSON / violates the schema (says which field, why)
    │   ├── GroupMismatchError             body ``group_id`` disagrees with the SQS ``MessageGroupId``
    │   ├── PayloadTooLargeError           a payload or row over the configured limits
    │   ├── UnknownProfileError            the root's metadata selects an agent profile that is not configured
    │   ├── InvalidRewindError             a rewind to an order the thread does not have
    │   ├── ChoiceAnswerError              a user-choice answer that cannot be delivered (bad index, refused)
    │   └── NewerFormatError               a message or stored item written by a newer release's format
    ├── RetriesExhaustedError     reject   a record failed transiently on its last allowed attempt
    ├── TransientError            retry    the record fails, SQS redelivers it (DLQ after maxReceiveCount)
    │   ├── StoreError                     a store call failed
    │   ├── ConcurrentWriteError           another writer advanced the thread's head first
    │   └── QueueError                     sending to a queue failed
    │   └── CallbackError                  a RAP callback could not be delivered (the tool-server SDK)
    │       └── CallbackRefusedError  reject   the receiver refused it (4xx): resending cannot help
    ├── ProviderError             retry or reject, by ``retryable``: the model provider failed
    ├── ToolError                 result   becomes an ``Error: ...`` tool result for the model
    └── InvariantViolation        retry    a bug: a runtime rule was broken (never silently ignored)
        └── CorruptDataError               stored data this version cannot read (a thread tree, ...)
            └── CorruptRowError            a stored history row this version cannot read

``disposition`` values: ``"fatal"`` (stop the process), ``"reject"`` (drop the input with a clear error
event), ``"retry"`` (fail the record so the queue redelivers it), ``"result"`` (report to the model).

:func:`classify` is the one rule that turns *any* exception into a disposition; the worker, local mode,
the tool runner, the RAP receiver and the RAP server's callbacks decide through it. Exceptions outside the tree are ``"retry"`` (a transient failure of a library
or the network, or a bug that a fix and a redrive will get past), except the two that only bad input
raises: ``RecursionError`` (nesting too deep) and ``UnicodeError`` (text that is not encodable).
"""

from __future__ import annotations

from typing import ClassVar, Literal

Disposition = Literal["fatal", "reject", "retry", "result"]


class StepagentError(Exception):
    """Base of every deliberate stepagent error."""

    #: What happens to the input that caused an error of this class (see the module docstring).
    default_disposition: ClassVar[Disposition] = "retry"

    @property
    def disposition(self) -> Disposition:
        return self.default_disposition

    @property
    def retryable(self) -> bool:
        return self.disposition == "retry"


class ConfigurationError(StepagentError):
    """A setting is missing or invalid. The message names the variable and what is expected."""

    default_disposition = "fatal"


class InputError(StepagentError):
    """Deterministic bad input: retrying cannot help, so it is rejected with a clear message."""

    default_disposition = "reject"


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


class InvalidRewindError(InputError):
    """A rewind to an order outside ``0..tail`` of the thread."""


class ChoiceAnswerError(InputError):
    """A user-choice answer could not be delivered (bad index, network error, or the tool refused it)."""


class NewerFormatError(InputError):
    """A queued message or stored item in a format newer than this release reads (a rollback met data
    the newer release wrote). Never decoded by guesswork: the input is dead-lettered with this message,
    which names the version, and can be redriven once the newer release is back."""


class RetriesExhaustedError(StepagentError):
    """A record kept failing transiently and has used its last allowed attempt (the queue's
    maxReceiveCount). The worker gives up on it itself — DLQ copy, ``error`` event with ``retrying:
    false`` naming the attempts — so the thread's later records are not dragged into the DLQ with it."""

    default_disposition = "reject"

    def __init__(self, message: str, *, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class TransientError(StepagentError):
    """A failure that may succeed on retry (store, queue, network)."""

    default_disposition: ClassVar[Disposition] = "retry"


class StoreError(TransientError):
    """A conversation- or state-store call failed."""


class ConcurrentWriteError(TransientError):
    """The thread's head version moved under us: another writer committed first.

    The loser's work is discarded; the input is retried from a fresh load, so nothing is lost.
    """


class TransactionConflictError(ConcurrentWriteError):
    """DynamoDB cancelled a transaction because another one touched one of its items at the same moment
    (``TransactionConflict``). Nothing of it was written; trying the same operation again is safe."""


class QueueError(TransientError):
    """Sending a message to a queue failed."""


class CallbackError(TransientError):
    """A RAP callback could not be delivered to the receiver (raised by the tool-server SDK).
    ``retry_after``: the seconds the receiver asked the sender to wait (``Retry-After``), if it did."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class CallbackRefusedError(CallbackError):
    """The receiver refused a RAP callback (a 4xx answer): sending the same body again cannot help."""

    default_disposition = "reject"


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

    @property
    def disposition(self) -> Disposition:
        # A request the provider refused (bad request, authentication) fails the same way every time.
        return "retry" if self._retryable else "reject"


class ToolError(StepagentError):
    """A tool failed; the model receives ``Error: <message>`` as the call's result."""

    default_disposition = "result"


class InvariantViolation(StepagentError):
    """A runtime invariant was broken (a bug). Fails the step loudly instead of corrupting history."""

    default_disposition = "retry"


class CorruptDataError(InvariantViolation):
    """Stored data that this version cannot read (a row, a cyclic thread tree). Never skipped silently."""


class CorruptRowError(CorruptDataError):
    """A stored history row that this version cannot read."""


def classify(error: BaseException) -> Disposition:
    """What to do with the input whose processing raised ``error`` (the module docstring's rule)."""
    if isinstance(error, StepagentError):
        return error.disposition
    if isinstance(error, RecursionError | UnicodeError):
        return "reject"
    return "retry"
